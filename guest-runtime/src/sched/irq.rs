//! The runtime's interrupt handlers' common prologue, the reschedule IPI, and the safepoint
//! where a thread carries out what handlers deferred.

use activm_stub::{preempt, IrqFrame};

use super::{current_raw, preempt_current, Pending};
use crate::arch::cpu::{self, Word};
use crate::arch::{context, rseq};
use crate::{percpu, timer, upcall};

/// Common start of the runtime's interrupt handlers: rewinds a restartable sequence the
/// interrupt landed in, then says whether the interrupted code is a thread that may be switched
/// away right now (not the scheduler, no preemption hold, not before the trampoline's EOI).
pub fn irq_prologue(frame: &mut IrqFrame) -> bool {
    if let Some(abort) = rseq::fixup(context::frame_pc(frame)) {
        context::set_frame_pc(frame, abort);
        percpu::bump(&percpu::this().counters.rseq_rewinds);
    }
    if preempt::held() != 0 {
        percpu::bump(&percpu::this().counters.deferred_held);
        return false;
    }
    if cpu::get(Word::InSched) != 0 || current_raw().is_null() {
        percpu::bump(&percpu::this().counters.deferred_sched);
        return false;
    }
    if upcall::in_unsafe_window(context::frame_pc(frame)) {
        // Before the trampoline's EOI, or in an activation entry.
        return false;
    }
    // The frame must be on the current thread's stack. It is not when this interrupt nests in a
    // handler that interrupted an activation entry: that handler runs on the new activation's
    // stack while `Current` still names the previous activation's thread (whose context the
    // VMM may have handed to another vCPU). Switching "that thread" out here would file the
    // activation stack as its stack pointer.
    if on_current_thread_stack(frame as *const IrqFrame as usize) {
        true
    } else {
        percpu::trace(percpu::T_FOREIGN_STACK, context::frame_pc(frame));
        percpu::bump(&percpu::this().counters.deferred_sched);
        false
    }
}

/// Whether `at` lies on the stack of the thread `Current` names (false without one).
fn on_current_thread_stack(at: usize) -> bool {
    let cur = current_raw();
    if cur.is_null() {
        return false;
    }
    // SAFETY: TCBs are never freed (pooled), and a thread's stack bounds change only while it
    // does not run.
    match unsafe { &*cur }.stack.get() {
        Some(s) => at >= s.lo && at < s.hi,
        None => false,
    }
}

/// The reschedule IPI: it only has to wake a halted vCPU (whose scheduler then looks for work).
pub fn on_resched(frame: &mut IrqFrame) {
    if irq_prologue(frame) {
        if crate::blk::completions_ready() || crate::net::completions_ready() {
            // The VMM's nudge for block completions a busy vCPU left waiting: the scheduler
            // loop takes them.
            super::preempt_current();
            return;
        }
        // A clean context: also act on anything a nested interrupt had to defer.
        safepoint();
    } else {
        Pending::Resched.defer();
    }
}

/// Called when the last preemption hold is released with work pending, and after `switch_in`
/// (thread context): carries out what interrupt handlers deferred.
pub fn safepoint() {
    if preempt::held() != 0 || cpu::get(Word::InSched) != 0 {
        return;
    }
    // An interrupt handler on top of a new activation's entry, before the entry reset the
    // words, sees the previous activation's: its hold count, its pending work and its thread
    // (which now runs elsewhere, or waits to). Nothing may be done for "that thread" there; the
    // entry clears what is pending.
    let here = 0u8;
    if !on_current_thread_stack(core::ptr::addr_of!(here) as usize) {
        return;
    }
    let pending = cpu::take_pending();
    if pending == 0 {
        return;
    }
    if Pending::Upcall.is_in(pending) || Pending::Cont.is_in(pending) {
        // Let the scheduler drain the upcall queue (or take back a continued lock holder).
        preempt_current();
        return;
    }
    if Pending::Timer.is_in(pending) {
        timer::tick_in_thread();
    }
}

/// `switch_in` calls this (C ABI, by name) when work was pending at its commit.
#[unsafe(no_mangle)]
extern "C" fn __rt_safepoint() {
    safepoint();
}
