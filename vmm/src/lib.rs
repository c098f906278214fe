//! activm: a KVM virtual machine monitor whose vCPUs are scheduler activations.
//!
//! The crate's map: [`monitor`] runs guests on a budget of physical CPUs that [`allocator`]
//! shares out (its `Slot` is a vCPU's one state machine); [`guest`] is one guest; [`vcpu`] is
//! the per-vCPU thread (run loop, exits, hypercall handlers, hand-off) and [`kick`] how other
//! threads reach it; [`hypercall`] decodes a hypercall into a typed call; [`activation`] keeps
//! the activation state and writes upcall records through one view of the shared area, and
//! [`delivery`] decides where they go; [`loader`] checks and loads guest ELFs; [`memory`] is
//! guest RAM and the plan of what goes where; [`bootinfo`] writes the boot information;
//! [`signals`], [`ctl`], [`trace`], [`stats`] and [`console`] are the host-facing services;
//! [`hostfile`] opens what a user names (regular files only, never blocking); [`sandbox`] is
//! the seccomp filters and Landlock rules each thread enters after setup; [`config`] is
//! what `activm run` is asked to run (flags or a TOML file), checked, as plain data; [`vm`] is
//! how a guest ended and [`report`] the report of a run; [`arch`] holds what differs per
//! architecture, reached only through `arch::current`.

pub mod activation;
pub mod allocator;
pub mod arch;
pub mod bootinfo;
pub mod config;
pub mod console;
pub mod ctl;
pub mod delivery;
pub mod devices;
pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod guest;
pub mod hang;
pub mod hostfile;
pub mod hypercall;
pub mod kick;
pub mod loader;
pub mod memory;
pub mod monitor;
#[doc(hidden)]
pub mod preempt_at;
pub mod report;
pub mod runtime_view;
pub mod sandbox;
pub mod signals;
pub mod stats;
#[doc(hidden)]
pub mod testing;
pub mod timeline;
pub mod trace;
pub mod vcpu;
pub mod vm;

pub use config::{MonitorOptions, VmConfig};
pub use error::Error;
pub use monitor::{run, run_guests};
pub use report::RunReport;
pub use vm::Outcome;

/// The timestamp counter's frequency in kHz, measured against the monotonic clock over 5 ms.
pub fn tsc_khz_estimate() -> u64 {
    let start = std::time::Instant::now();
    let tsc = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let ticks = rdtsc().saturating_sub(tsc);
    (ticks as f64 / start.elapsed().as_secs_f64() / 1000.0) as u64
}

/// Read the host's timestamp counter (guest and host agree: the VMM sets a zero offset).
pub fn rdtsc() -> u64 {
    arch::current::timestamp()
}
