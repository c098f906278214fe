//! New activations, the Rust side: the first instructions are `arch::entry`'s.

use core::sync::atomic::Ordering;

use super::VECTOR_SIM;
use crate::activation::poison;
use crate::activation::stacks::produce_spares;
use crate::activation::state::file_old_state;
use crate::arch::entry::OldWords;
use crate::arch::{context, cpu, RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ};
use crate::{percpu, sched};

/// The vectors whose EOI a previous activation may have left owed on this vCPU.
pub(super) const OUR_VECTORS: [u8; 4] = [TIMER_IRQ, RESCHEDULE_IRQ, UPCALL_IRQ, VECTOR_SIM];

/// Rust side of a new activation, on its pool stack, with the vCPU's words already reset
/// (called by `arch::entry`'s assembly, by name).
#[unsafe(no_mangle)]
extern "C" fn __rt_activation_start(
    _vcpu: u64,
    activation: u64,
    top: u64,
    old: *const OldWords,
) -> ! {
    if poison::on() {
        poison::handed_out(top);
    }
    context::reset_fp_control();
    let me = activm_stub::vcpu_id();
    // SAFETY: the entry saved the previous words at `old`, on this stack.
    let old = unsafe { *old };
    cpu::end_owed_interrupts(&OUR_VECTORS);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    file_old_state(me, &old);
    // What the previous activation here gave back (and any other spare) goes to the pool at
    // once: this activation may end before its first drain does (see `produce_spares`).
    produce_spares();
    sched::clear_idle_bits(me);
    percpu::trace(percpu::T_ACTIVATION, activation);
    percpu::bump(&percpu::this().counters.activations);
    sched::enter_loop()
}
