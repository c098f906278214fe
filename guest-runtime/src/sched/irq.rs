//! The runtime's interrupt handlers' common prologue: whether the interrupted code is a thread
//! that may be switched away. The handlers themselves, and the safepoint where a thread carries
//! out what they deferred, are `dispatch::points`'.

use activm_stub::{preempt, IrqFrame};

use super::current_raw;
use crate::arch::cpu::{self, Word};
use crate::arch::entry;
use crate::arch::{context, rseq};
use crate::percpu;

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
    if in_unsafe_window(context::frame_pc(frame)) {
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
pub fn on_current_thread_stack(at: usize) -> bool {
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

/// Whether code at `pc` must not be switched away: the trampoline before its EOI, or an
/// activation entry before it reset the words.
pub fn in_unsafe_window(pc: u64) -> bool {
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    let (entry_start, _, entry_end) = entry::window();
    (trap_start..trap_end).contains(&pc) || (entry_start..entry_end).contains(&pc)
}
