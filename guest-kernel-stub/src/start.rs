//! The architecture-neutral part of vCPU start-up (at CPL3), and the boot information.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicBool, Ordering};

use protocol::boot::{BootInfo, BOOT_FLAG_ENTROPY, BOOT_FLAG_ENV, BOOT_INFO_MAGIC};
use protocol::ABI_VERSION;

use crate::arch::current as arch;

/// vCPU 0's copy of the VMM's `BootInfo`, taken at boot (the guest writes timestamps into the
/// original, so it keeps no reference to it).
struct BootInfoCopy(UnsafeCell<MaybeUninit<BootInfo>>);

// SAFETY: written once by vCPU 0 before `COPIED` is released, read-only afterwards.
unsafe impl Sync for BootInfoCopy {}

static BOOT_INFO: BootInfoCopy = BootInfoCopy(UnsafeCell::new(MaybeUninit::uninit()));
static COPIED: AtomicBool = AtomicBool::new(false);

/// The VMM's entropy seed, moved out of `BootInfo` at boot; taken once by the random generator
/// ([`take_entropy_seed`]).
static ENTROPY_SEED: crate::sync::SpinLock<Option<[u8; 32]>> = crate::sync::SpinLock::new(None);

extern "Rust" {
    /// Defined by the layer above with [`crate::vcpu_entry!`].
    fn __activm_vcpu_entry(vcpu: u32) -> !;
}

/// Checks the boot information, sets up this vCPU and calls the layer above.
///
/// # Safety
/// Called once per vCPU with the VMM's `BootInfo` pointer and this vCPU's index, after the
/// per-vCPU block is set up.
pub(crate) unsafe fn vcpu_main(info: *mut BootInfo, vcpu: u32) -> ! {
    // SAFETY: the VMM hands every vCPU a mapped, initialised BootInfo.
    let (magic, abi_version) = unsafe { ((*info).magic, (*info).abi_version) };
    assert!(
        magic == BOOT_INFO_MAGIC,
        "BootInfo at {info:p} has magic {magic:#018x}, expected {BOOT_INFO_MAGIC:#018x}: not started by activm?"
    );
    assert!(
        abi_version == ABI_VERSION,
        "activm ABI mismatch: this guest was built for ABI version {ABI_VERSION}, the VMM speaks version {abi_version}"
    );
    arch::init_vcpu();
    if vcpu == 0 {
        // SAFETY: only vCPU 0 writes the copy, before releasing `COPIED`.
        let copy = unsafe { (*BOOT_INFO.0.get()).write(info.read_volatile()) };
        // SAFETY: as above: the copy is still vCPU 0's alone; the original is mapped read-write.
        unsafe { move_entropy_seed(copy, info) };
        check(copy);
        // SAFETY: the VMM reserves [heap_start, heap_end) as free RAM for the guest.
        unsafe { crate::heap::init(copy.heap_start, copy.heap_end) };
        COPIED.store(true, Ordering::Release);
    } else {
        while !COPIED.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
        crate::heap::wait_ready();
    }
    let nr_vcpus = boot_info().nr_vcpus;
    assert!(
        vcpu < nr_vcpus,
        "vCPU {vcpu} started but BootInfo says {nr_vcpus} vCPUs"
    );
    let main_tsc = crate::rdtsc();
    // SAFETY: vcpu < MAX_VCPUS (checked by the arch entry); only the VMM reads this field.
    unsafe { addr_of_mut!((*info).vcpus[vcpu as usize].main_tsc).write_volatile(main_tsc) };
    // SAFETY: provided by the layer above through `vcpu_entry!`.
    unsafe { __activm_vcpu_entry(vcpu) }
}

/// Moves the VMM's entropy seed (if it sent one) into [`ENTROPY_SEED`] and zeroes it in the
/// copy and in the VMM's page, so that nothing else in guest memory holds it.
///
/// # Safety
/// `copy` is not shared yet; `info` is the VMM's mapped `BootInfo`.
unsafe fn move_entropy_seed(copy: &mut BootInfo, info: *mut BootInfo) {
    if !copy.has(BOOT_FLAG_ENTROPY) {
        return;
    }
    *ENTROPY_SEED.lock() = Some(copy.entropy_seed);
    copy.entropy_seed = [0; 32];
    // SAFETY: the caller's contract; a volatile store, so the zeroing is not elided.
    unsafe { addr_of_mut!((*info).entropy_seed).write_volatile([0; 32]) };
}

/// The VMM's entropy seed, the first time this is called (`None` after, or from a VMM that sent
/// none). The caller owns the only copy.
pub fn take_entropy_seed() -> Option<[u8; 32]> {
    ENTROPY_SEED.lock().take()
}

/// Checks that the VMM's layout agrees with the one this guest was built for.
fn check(info: &BootInfo) {
    assert!(
        info.hypercall_base == protocol::arch::current::HYPERCALL_BASE,
        "BootInfo hypercall page {:#x} is not the ABI's {:#x}",
        info.hypercall_base,
        protocol::arch::current::HYPERCALL_BASE
    );
    crate::arch::current::check_boot_info(info);
}

/// The boot information (a copy taken by vCPU 0 at boot; timestamps are not kept up to date).
pub fn boot_info() -> &'static BootInfo {
    debug_assert!(COPIED.load(Ordering::Relaxed));
    // SAFETY: every vCPU waits for `COPIED` before it runs the layer above; the copy is not
    // written afterwards.
    unsafe { (*BOOT_INFO.0.get()).assume_init_ref() }
}

/// Number of vCPUs the guest was started with.
pub fn nr_vcpus() -> u32 {
    boot_info().nr_vcpus
}

/// TSC frequency in kHz.
pub fn tsc_khz() -> u64 {
    boot_info().tsc_khz
}

/// The guest arguments (after `--` on the activm command line).
pub fn args() -> Args {
    let info = boot_info();
    strings(info.args, info.args_len, info.argc)
}

/// The guest environment (`activm run --env`): `KEY=VALUE` strings, none if the VMM passes
/// none.
pub fn env() -> Args {
    let info = boot_info();
    if info.has(BOOT_FLAG_ENV) {
        strings(info.env, info.env_len, info.envc)
    } else {
        strings(0, 0, 0)
    }
}

/// `count` NUL-terminated strings packed in `len` bytes at `addr`, in the argument block.
fn strings(addr: u64, len: u32, count: u32) -> Args {
    let bytes: &'static [u8] = if addr == 0 || len == 0 {
        &[]
    } else {
        // SAFETY: the VMM maps the argument block for the guest's lifetime and never writes it
        // after boot.
        unsafe { core::slice::from_raw_parts(addr as *const u8, len as usize) }
    };
    Args {
        rest: bytes,
        left: count as usize,
    }
}

/// Iterator over the guest arguments or environment strings.
#[derive(Clone, Debug)]
pub struct Args {
    rest: &'static [u8],
    left: usize,
}

impl Iterator for Args {
    type Item = &'static str;

    fn next(&mut self) -> Option<&'static str> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.rest.len());
        let arg = &self.rest[..end];
        self.rest = self.rest.get(end + 1..).unwrap_or(&[]);
        Some(core::str::from_utf8(arg).unwrap_or("<invalid UTF-8>"))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Args {}
