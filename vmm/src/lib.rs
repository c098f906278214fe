//! activm: a KVM virtual machine monitor whose vCPUs are scheduler activations.
//!
//! The crate's map: [`monitor`] runs guests on a budget of physical CPUs that [`allocator`]
//! shares out; [`guest`] is one guest; [`vcpu`] is the per-vCPU thread, its state machine and
//! its kick; [`activation`] writes upcall records and starts new activations; [`hypercall`]
//! dispatches guest requests; [`loader`] checks and loads guest ELFs; [`memory`] is guest RAM
//! and the plan of what goes where; [`bootinfo`] writes the boot information; [`signals`],
//! [`ctl`], [`trace`] and [`stats`] are the host-facing services; [`config`] is what
//! `activm run` is asked to run (flags or a TOML file), checked; [`arch`] holds what differs
//! per architecture.

pub mod activation;
pub mod allocator;
pub mod arch;
pub mod bootinfo;
pub mod config;
pub mod console;
pub mod ctl;
pub mod devices;
pub mod error;
pub mod guest;
pub mod hostfile;
pub mod hypercall;
pub mod loader;
pub mod memory;
pub mod monitor;
pub mod sandbox;
pub mod signals;
pub mod stats;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod vcpu;
pub mod vm;

pub use error::Error;
pub use monitor::{run_guests, MonitorOptions};
pub use vm::{run, Outcome, RunReport, VmConfig};

/// The TSC frequency in kHz, measured against the monotonic clock over 5 ms.
pub fn tsc_khz_estimate() -> u64 {
    let start = std::time::Instant::now();
    let tsc = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let ticks = rdtsc().saturating_sub(tsc);
    (ticks as f64 / start.elapsed().as_secs_f64() / 1000.0) as u64
}

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
