//! The activm ABI, shared by the VMM and every guest: nothing here is redefined elsewhere.
//!
//! * [`boot`]: the header a guest image carries and the boot information the VMM hands it.
//! * [`hypercall`]: how a guest asks the VMM for something (an 8-byte load from a page with no
//!   memory behind it) and the numbers of the calls.
//! * [`shared`]: the activation shared area: per-vCPU state and upcall event queues, and the
//!   guest-to-VMM requests (concurrency, idle vCPUs, upcall stacks).
//! * [`timeline`]: the runtime's per-vCPU event rings the VMM merges into its trace.
//! * [`diag`]: the runtime's self-description the VMM reads for its hang report.
//! * [`blk`]: the block device behind the `blk_*` hypercalls.
//! * [`fs`]: host directories mapped into the guest, behind the `fs_*` hypercalls.
//! * [`arch`]: per-architecture constants and the saved user context.
//!
//! Every type that crosses the boundary is `#[repr(C)]` with its layout pinned by tests.
//! `docs/protocol.md` is the prose specification.
#![no_std]
#![forbid(unsafe_code)]

mod wire;

pub mod arch;
pub mod blk;
pub mod blk_submit;
pub mod boot;
pub mod diag;
pub mod fs;
pub mod hypercall;
pub mod net;
pub mod shared;
pub mod timeline;

use wire::wire_enum;
pub use wire::UnknownWireValue;

/// The ABI version. Both sides refuse to run with a peer of another version.
/// Bump it on any change to a `#[repr(C)]` type, a hypercall or a constant in this crate, with
/// one exception: fields appended to [`boot::BootInfo`] behind a new `BOOT_FLAG_*` bit (the
/// guest reads them only when the VMM sets the bit, so an older VMM of the same version still
/// boots a newer guest, and a newer VMM an older guest).
pub const ABI_VERSION: u32 = 6;

/// The largest number of vCPUs a guest may have.
pub const MAX_VCPUS: usize = 64;

/// The cache-line size both sides align shared fields to.
pub const CACHE_LINE: usize = 64;

/// Guest page size.
pub const PAGE_SIZE: u64 = 4096;

wire_enum! {
    /// The architecture a guest image is built for, as recorded in its [`boot::BootHeader`].
    pub enum Arch: u32 {
        X86_64 = 1 => "x86_64",
        Aarch64 = 2 => "aarch64",
    }
}

impl Arch {
    /// The architecture this crate is being compiled for.
    pub const CURRENT: Arch = if cfg!(target_arch = "aarch64") {
        Arch::Aarch64
    } else {
        Arch::X86_64
    };
}

/// A cache-line-aligned wrapper, so fields written by different sides never share a line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CacheAligned<T>(pub T);

impl<T> core::ops::Deref for CacheAligned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_aligned_is_one_line() {
        assert_eq!(core::mem::size_of::<CacheAligned<u32>>(), CACHE_LINE);
        assert_eq!(core::mem::align_of::<CacheAligned<u64>>(), CACHE_LINE);
    }

    #[test]
    fn arch_round_trips() {
        assert_eq!((Arch::X86_64.raw(), Arch::Aarch64.raw()), (1, 2));
        for &arch in Arch::ALL {
            assert_eq!(Arch::from_raw(arch as u32), Some(arch));
        }
        assert_eq!(Arch::from_raw(0), None);
    }
}
