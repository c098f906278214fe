//! activm: a KVM virtual machine monitor whose vCPUs are scheduler activations.
//!
//! The crate's map: [`vm`] creates and runs a guest; [`vcpu`] is the per-vCPU thread and its
//! kick; [`hypercall`] dispatches guest requests; [`loader`] checks and loads guest ELFs;
//! [`memory`] is guest RAM and the plan of what goes where; [`bootinfo`] writes the boot
//! information; [`arch`] holds what differs per architecture.

pub mod arch;
pub mod bootinfo;
pub mod error;
pub mod hypercall;
pub mod loader;
pub mod memory;
#[doc(hidden)]
pub mod testing;
pub mod vcpu;
pub mod vm;

pub use error::Error;
pub use vm::{run, Outcome, RunReport, VmConfig};

/// Read the host TSC (guest and host TSC agree: the VMM sets a zero TSC offset).
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}
