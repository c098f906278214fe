//! The surface of the architecture activm is built for: shared code reaches an architecture
//! only through this list, and a port provides every item of it.

#[cfg(target_arch = "aarch64")]
use super::aarch64 as this;
#[cfg(target_arch = "x86_64")]
use super::x86_64 as this;

// The ABI constants (`protocol::arch::*`) and where the VMM puts its boot structures.
pub use super::layout;
pub use this::{abi, boot, ELF_MACHINE, IRQ_CONTROLLER_BASE};
// The VM and its vCPUs: the KVM capabilities needed, the interrupt controller, initial vCPU
// state, the upcall interrupt.
pub use this::{
    configure_vcpu, send_upcall_interrupt, send_wakeup_interrupt, setup_vm, ArchVm, REQUIRED_CAPS,
};
// Exits: syncing registers out, hypercall arguments and result, halting and waking.
pub use this::exit::{
    describe_pc, halt, halted, hypercall_args, make_runnable, prepare_run, set_hypercall_result,
    timestamp, timestamp_khz, undelivered_interrupt, Vectors,
};
// The user context: the hand-over test, taking it, starting a new activation.
pub use this::context::{at_activation_entry, at_user_level, enter_activation, take_user_context};
// Reports, and a guest that crashes at once for the tests.
pub use this::vcpu::{dump, fatal_trap_report};
pub use this::{register_transfer_stats, INTERNAL_ERROR_HINT, TRIPLE_FAULT_CODE};
// Testing only (`--preempt-at`): stopping a vCPU at a chosen address.
pub use this::preempt;
// The sandbox: the seccomp target and the KVM ioctl requests each thread kind makes.
pub use this::seccomp;
