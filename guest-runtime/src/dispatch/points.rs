//! The scheduling points: the runtime's interrupt handlers (the timer, the reschedule IPI,
//! the simulated VMM's) and the safepoint where a thread carries out what they deferred. They
//! poll what the scheduler core knows nothing of (sleepers, device completions, the ask for
//! processors) before switching the thread out.

use core::sync::atomic::Ordering;

use activm_stub::{preempt, IrqFrame};

use super::idle::work_queued;
use crate::activation::sa;
use crate::alarm::{ensure_armed_by, MIN_ARM_NS};
use crate::arch::context;
use crate::arch::cpu::{self, Word};
use crate::percpu::{self, ns_to_ticks};
use crate::sched::{self, Pending};
use crate::{blk, config, net, timer, upcall};

/// Random preemption re-arms the timer at most this many times in a row while its interrupts
/// are deferred (`on_timer`).
const MAX_DEFERRED_REARMS: u32 = 4;

/// The timer interrupt.
pub fn on_timer(frame: &mut IrqFrame) {
    cpu::set(Word::Armed, 0);
    percpu::trace(percpu::T_TIMER, context::frame_pc(frame));
    crate::watchdog::check(context::frame_pc(frame));
    percpu::bump(&percpu::this().counters.timer_irqs);
    upcall::sim_on_interrupt(frame);
    if !sched::irq_prologue(frame) {
        Pending::Timer.defer();
        if let Some((min, _)) = config::random_preemption() {
            // Keep interrupting at random points even while deferring (tests), a few times:
            // where an interrupt takes longer to deliver than `min` (~120 us on some kvm_pvm
            // hosts), each re-arm nested the next interrupt inside this one until the stack
            // overflowed (`rt-tests std-cases-preempted`).
            let deferrals = &percpu::this().timer_deferrals;
            if deferrals.fetch_add(1, Ordering::Relaxed) < MAX_DEFERRED_REARMS {
                ensure_armed_by(cpu::rdtsc() + ns_to_ticks(min));
            }
        }
        return;
    }
    percpu::this().timer_deferrals.store(0, Ordering::Relaxed);
    tick_in_thread();
    // Anything a nested interrupt deferred meanwhile.
    safepoint();
}

/// A timer tick for the running thread (clean thread context): wake sleepers, then preempt the
/// thread if its slice is over and another waits, or re-arm.
pub fn tick_in_thread() {
    // Not under a preemption hold: `wake_due` may spin for the sleepers' lock, and a vCPU that
    // spins holding one defers its upcalls, so it could never take the record that continues
    // the lock's preempted holder (found by the soak: the guest stalled with that record in
    // the spinning vCPU's queue).
    if timer::sleepers_due() {
        timer::wake_due();
    }
    if sa::backlog_waiting() && sa::some_yielded() {
        if work_queued() {
            sa::want_processors();
        } else {
            sa::backlog_cleared();
        }
    }
    let hold = preempt::Hold::new();
    let cur = sched::current();
    let start = cur.slice_start.load(Ordering::Relaxed);
    let now = cpu::rdtsc();
    let expired =
        config::random_preemption().is_some() || now.saturating_sub(start) >= config::slice_ticks();
    let preempt = expired && sched::runnable_elsewhere();
    if preempt {
        // The next thread gets a fresh timer when it is switched in.
    } else if let Some(deadline) = sched::wanted_deadline(start) {
        ensure_armed_by(deadline.max(now + ns_to_ticks(MIN_ARM_NS)));
    }
    drop(hold);
    if preempt {
        sched::preempt_current();
    }
}

/// The reschedule IPI: it only has to wake a halted vCPU (whose scheduler then looks for work).
pub fn on_resched(frame: &mut IrqFrame) {
    if sched::irq_prologue(frame) {
        if blk::completions_ready() || net::completions_ready() {
            // The VMM's nudge for block completions a busy vCPU left waiting: the scheduler
            // loop takes them.
            sched::preempt_current();
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
    if !sched::on_current_thread_stack(core::ptr::addr_of!(here) as usize) {
        return;
    }
    let pending = cpu::take_pending();
    if pending == 0 {
        return;
    }
    if Pending::Upcall.is_in(pending) || Pending::Cont.is_in(pending) {
        // Let the scheduler drain the upcall queue (or take back a continued lock holder).
        sched::preempt_current();
        return;
    }
    if Pending::Timer.is_in(pending) {
        tick_in_thread();
    }
}

/// A spinlock waiter's hook (every 2^16 spins): the watchdog, and in a scheduler, the processors
/// a holder's adoption needs. A scheduler spinning for a lock never reaches its loop top, where
/// preempted scheduler contexts are adopted; if one holding a spinlock waits there (it may hold
/// this very lock: the six-guest soak's run 147), another vCPU's scheduler must adopt it, so the
/// guest asks back the processors it gave up (`want_processors`, rate-limited).
pub fn lock_wait() {
    crate::watchdog::tick();
    if cpu::get(Word::InSched) != 0 && upcall::holder_waits_for_adoption() {
        sa::want_processors();
    }
}

/// `switch_in` calls this (C ABI, by name) when work was pending at its commit.
#[unsafe(no_mangle)]
extern "C" fn __rt_safepoint() {
    safepoint();
}

/// The simulated VMM's interrupt.
#[cfg(feature = "sim")]
pub fn on_sim(frame: &mut IrqFrame) {
    upcall::sim_on_interrupt(frame);
    if sched::irq_prologue(frame) {
        safepoint();
    }
}
