//! The per-vCPU scheduler loop, on top of everything: what a vCPU does when no thread runs. It
//! drains the upcall queue, takes device completions, wakes due sleepers, picks a thread, and
//! idles when there is none. The scheduler core (`sched`: run queues, switching, wait and
//! wake) knows nothing of devices, sleepers or upcalls; this module is its caller: a thread's
//! `switch_out` lands here ([`__rt_sched_entry`]), and a fresh scheduler stack enters
//! [`sched_loop`] through the one hook set at start-up (`sched::enter_loop`).
//!
//! **Files.** This one: the landing and the loop; `idle`: idling, halting and giving the
//! processor back; `points`: the interrupt handlers and the safepoint.

use crate::activation::sa;
use crate::arch::cpu::{self, Word};
use crate::sched::{self, find_runnable, take_next, Pending, Switch};
use crate::tcb::{self, Tcb};
use crate::{blk, net, timer, upcall};

pub(crate) mod idle;
pub mod points;
mod spin;

/// Where `switch_out` lands, on this activation's stack, with `prev` fully saved (called by
/// `arch::context`'s assembly, by name).
#[unsafe(no_mangle)]
extern "C" fn __rt_sched_entry(prev: *const Tcb, action: usize, arg: usize) -> ! {
    let (action, mut hand_to) = sched::finish_switch(prev, action, arg);
    if action == Switch::Park || action == Switch::Exit {
        // A blocking switch: hand the processor over directly (the thread given, the joiner the
        // exit woke, or this vCPU's `next`) unless the loop has work of its own first.
        if loop_has_work() {
            if !hand_to.is_null() {
                // SAFETY: ours (see `finish_switch`); it runs first once the loop's work is done.
                sched::make_next(unsafe { tcb::from_raw(hand_to) });
            }
        } else {
            if hand_to.is_null() {
                hand_to = take_next();
            }
            if !hand_to.is_null() {
                // SAFETY: ours (see `finish_switch`, or just taken off `next`).
                sched::run_now(unsafe { tcb::from_raw(hand_to) }, true);
            }
        }
    }
    sched_loop()
}

/// Whether the scheduler loop must run before any thread (deferred interrupt work, upcall
/// records or continuations, due sleepers): a direct hand-off must not skip it.
#[inline]
fn loop_has_work() -> bool {
    cpu::pending() != 0 || upcall::loop_work() || timer::sleepers_due()
}

/// The scheduler loop, on this activation's stack. Never returns: it switches to a thread.
pub fn sched_loop() -> ! {
    loop {
        cpu::set(Word::SchedIdle, 0);
        crate::watchdog::tick();
        let pending = cpu::take_pending();
        upcall::drain();
        blk::poll_completions();
        net::poll_completions();
        if Pending::Timer.is_in(pending) || timer::sleepers_due() {
            timer::try_wake_due();
        }
        let (t, inherit) = find_runnable();
        if !t.is_null() {
            // More work waits behind this thread while vCPUs have given their processors back:
            // ask for them again. The wakes that published it may have asked nobody (a vCPU was
            // spinning for work then, or the ask was rate-limited).
            if sa::some_yielded() {
                if idle::work_queued() {
                    sa::want_processors();
                } else {
                    sa::backlog_cleared();
                }
            }
            // SAFETY: a runnable TCB taken off a queue: ours now.
            sched::run_now(unsafe { tcb::from_raw(t) }, inherit);
        }
        idle::idle();
    }
}
