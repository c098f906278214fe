//! Architecture-specific parts of the VMM, with the same shape on each architecture:
//! `layout` (where the VMM puts its boot structures), `boot` (building them in guest memory),
//! `vcpu` (initial vCPU state and register dumps), `context` (a vCPU's user context: the
//! hand-over test, taking it, entering a new activation), `exit` (hypercall arguments and
//! result, halting, the timestamp counter).
//!
//! Shared code reaches an architecture only through [`current`], whose list below is the whole
//! surface a port has to provide.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;

#[cfg(target_arch = "x86_64")]
pub mod x86_64;

/// The surface of the architecture activm is built for.
pub mod current {
    #[cfg(target_arch = "aarch64")]
    use super::aarch64 as this;
    #[cfg(target_arch = "x86_64")]
    use super::x86_64 as this;

    // The ABI constants (`protocol::arch::*`) and where the VMM puts its boot structures.
    pub use this::{abi, boot, layout, ELF_MACHINE};
    // The VM and its vCPUs: the interrupt controller, initial vCPU state, the upcall interrupt.
    pub use this::{configure_vcpu, send_upcall_interrupt, setup_vm, ArchVm};
    // Exits: syncing registers out, hypercall arguments and result, halting and waking.
    pub use this::exit::{
        describe_pc, halt, hypercall_args, make_runnable, prepare_run, set_hypercall_result,
        timestamp, timestamp_khz,
    };
    // The user context: the hand-over test, taking it, starting a new activation.
    pub use this::context::{
        at_activation_entry, at_user_level, enter_activation, take_user_context,
    };
    // Reports.
    pub use this::vcpu::{dump, fatal_trap_report};
}
