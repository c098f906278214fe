//! Socket waits with a deadline (`SO_RCVTIMEO`, `SO_SNDTIMEO`, `poll`'s timeout): the waits of
//! [`crate::net`], parked on the runtime's sleepers' list as well (`sync::timed`), so nothing
//! polls and no processor is held.
//!
//! Two parties may wake such a thread: the timer at its deadline and the report of its tag
//! (`poll_completions`). Each claims the wake-up in `Tcb::timed` first and only the claimant
//! wakes it:
//!
//! * the timer: `TIMED_ARMED -> TIMED_BY_TIMER` (`timer::wake_due`);
//! * the report: `TIMED_ARMED -> TIMED_NOTIFIED` (it wakes the thread), or
//!   `TIMED_BY_TIMER -> TIMED_NOTIFIED` (it does not: the timer did) (`net::claim_report`).
//!
//! At its deadline a thread the timer woke **withdraws** its tag: a compare-and-swap of the
//! buffer's `waiter` word back to 0 (receive buffers, transmit rings), or the `cancel` call
//! (other waits, `protocol::net::NET_OP_CANCEL`). Success: the VMM never took the tag, no
//! report will come, the tag is free again and the wait timed out. Failure: the VMM took the
//! tag and its report is in the ring or on its way; the thread must not free the tag (a later
//! wait could take it and be woken by this report) nor wait afresh before the report was
//! claimed. It settles who wakes it with one compare-and-swap, `TIMED_BY_TIMER -> TIMED_NONE`,
//! after `prepare_wait`: if that wins, the report's claim sees `TIMED_NONE` and wakes it (the
//! wait below takes exactly that wake-up); if it loses, the report claimed already
//! (`TIMED_NOTIFIED`) without a wake-up and the thread waits for none. So every report wakes the
//! wait it belongs to at most once, a timed-out thread is never woken by a report of the wait it
//! left, and a report that lost the race to the deadline is not lost: the wait ends as ready
//! (the caller looks at its socket again). A thread ends every wait with `timed` back at
//! `TIMED_NONE` and off the sleepers' list, before it frees its tag.

use core::sync::atomic::{AtomicU32, Ordering};

use activm_stub::protocol::net::{NET_NO_WAIT, NET_WAITING};

use crate::arch::cpu;
use crate::net::{free_tag, ring_ready, take_tag, WAITERS};
use crate::sync::timed;
use crate::tcb::Tcb;
use crate::{sched, timer};

/// The TSC deadline `ns` nanoseconds from now.
pub fn deadline_in_ns(ns: u64) -> u64 {
    timer::deadline_in(core::time::Duration::from_nanos(ns))
}

/// Whether TSC `deadline` has passed.
pub fn passed(deadline: u64) -> bool {
    cpu::rdtsc() >= deadline
}

/// Parks the calling thread until TSC `deadline` (the last stretch is spun, yielding).
pub fn wait_until(deadline: u64) {
    if !passed(deadline) {
        let me = sched::current();
        me.prepare_wait();
        timer::add_sleeper(me, deadline);
        sched::wait(me);
    }
    timer::spin_until(deadline, || false);
}

/// The current thread `me`, armed (`timed::arm`) with its tag out to the VMM, waits until the
/// report or TSC `deadline`; `withdraw()` takes the tag back (true: the VMM never took it).
/// Returns whether the wait timed out. See the module for the races.
fn finish(me: &Tcb, deadline: u64, withdraw: impl FnOnce() -> bool) -> bool {
    sched::wait(me);
    if timed::notified(me) {
        // The report came first (the timer may have found us claimed and dropped us).
        timer::remove_sleeper(me);
        me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
        return false;
    }
    // The timer woke us, a little early; the report may still claim meanwhile.
    timer::spin_until(deadline, || timed::notified(me));
    if !timed::notified(me) && withdraw() {
        me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
        return true;
    }
    // The VMM took the tag: its report wakes us unless it claimed already.
    me.prepare_wait();
    if me
        .timed
        .compare_exchange(
            timer::TIMED_BY_TIMER,
            timer::TIMED_NONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    {
        sched::wait(me);
    }
    me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
    false
}

fn record(tag: u32, me: &Tcb) {
    WAITERS[tag as usize].store(me as *const Tcb as *mut Tcb, Ordering::Relaxed);
}

/// [`crate::net::wait_for`] with a deadline: parks until the VMM reports `waiter`, `ready()`
/// holds after the tag is published, or TSC `deadline`. Returns whether the deadline passed
/// (the caller looks at its buffer once more either way). May return early, like `wait_for`.
pub fn wait_for_until(waiter: &AtomicU32, ready: impl Fn() -> bool, deadline: u64) -> bool {
    if passed(deadline) {
        return true;
    }
    if !ring_ready() {
        sched::yield_current();
        return passed(deadline);
    }
    let Some(tag) = take_tag() else {
        sched::yield_current();
        return passed(deadline);
    };
    let me = sched::current();
    record(tag, me);
    timed::arm(me, deadline);
    if waiter
        .compare_exchange(0, tag + 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // Another thread waits on this buffer; its report is not ours.
        timed::disarm(me);
        free_tag(tag);
        sched::yield_current();
        return passed(deadline);
    }
    if ready()
        && waiter
            .compare_exchange(tag + 1, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        // Taken back before the VMM saw it: nobody reports this tag.
        timed::disarm(me);
        free_tag(tag);
        return false;
    }
    let timed_out = finish(me, deadline, || {
        waiter
            .compare_exchange(tag + 1, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    free_tag(tag);
    timed_out
}

/// [`crate::net::call`] with a deadline: `op(tag)` makes the `net` call; while it answers
/// `NET_WAITING` the thread parks until the report (then `op` is retried) or TSC `deadline`
/// (then `cancel(tag)` withdraws the wait: true if the VMM had not reported it yet). `None`:
/// the deadline passed.
///
/// # Safety
/// As [`crate::net::call`].
pub unsafe fn call_until(
    mut op: impl FnMut(u64) -> u64,
    cancel: impl Fn(u32) -> bool,
    deadline: u64,
) -> Option<u64> {
    loop {
        if passed(deadline) {
            return None;
        }
        if !ring_ready() {
            return Some(op(NET_NO_WAIT));
        }
        let Some(tag) = take_tag() else {
            let r = op(NET_NO_WAIT);
            if r != (-11i64) as u64 {
                return Some(r);
            }
            sched::yield_current();
            continue;
        };
        let me = sched::current();
        record(tag, me);
        timed::arm(me, deadline);
        let r = op(u64::from(tag));
        if r != NET_WAITING {
            // Not waiting: nobody reports this tag.
            timed::disarm(me);
            free_tag(tag);
            return Some(r);
        }
        let timed_out = finish(me, deadline, || cancel(tag));
        free_tag(tag);
        if timed_out {
            return None;
        }
    }
}
