//! Timed waits: a thread that waits in a primitive's list (or on its park token) *and* on the
//! runtime's sleepers' list until a deadline. Two parties may wake it, so each claims the
//! wake-up in `Tcb::timed` first (see `timer`): a notifier with [`claim`], under the lock of
//! the list it found the waiter in; the timer in `timer::wake_due`. Only the claimant wakes it.
//! Used by `Condvar::wait_timeout`, `Receiver::recv_timeout` and `thread::park_timeout`.

use core::sync::atomic::Ordering;

use crate::tcb::Tcb;
use crate::{sched, timer};

/// The current thread `me` is about to make itself findable for a timed wait until TSC
/// `deadline`: it waits ([`Tcb::prepare_wait`]) and sleeps on the timer's list.
pub(crate) fn arm(me: &Tcb, deadline: u64) {
    me.prepare_wait();
    me.timed.store(timer::TIMED_ARMED, Ordering::Relaxed);
    timer::add_sleeper(me, deadline);
}

/// Moves `t`'s timed wait from armed to notified: whether it was armed (the timer had not
/// claimed it).
pub(crate) fn take_armed(t: &Tcb) -> bool {
    t.timed
        .compare_exchange(
            timer::TIMED_ARMED,
            timer::TIMED_NOTIFIED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// A notifier, under the lock of the list it just took `t` from: claims `t`'s wake-up. Returns
/// whether the caller must wake it (after dropping the lock); false for a timed waiter the timer
/// already woke (it sees the notification itself). Never fails to deliver: a timed waiter still
/// in the list has not timed out yet (it leaves the list under that lock).
pub(crate) fn claim(t: &Tcb) -> bool {
    match t.timed.load(Ordering::Acquire) {
        timer::TIMED_NONE => true,
        _ => {
            if take_armed(t) {
                return true;
            }
            // The timer woke it; its deadline has not been reached (it would have left the
            // list under this lock).
            t.timed.store(timer::TIMED_NOTIFIED, Ordering::Release);
            false
        }
    }
}

/// Under the lock of the list `me` waits in, at or after its deadline: whether nobody claimed
/// its wake-up but the timer, i.e. it timed out (and must take itself off the list now).
pub(crate) fn timed_out_under_lock(me: &Tcb) -> bool {
    me.timed.load(Ordering::Acquire) == timer::TIMED_BY_TIMER
}

/// Whether a notifier claimed `me`'s wake-up.
pub(crate) fn notified(me: &Tcb) -> bool {
    me.timed.load(Ordering::Acquire) == timer::TIMED_NOTIFIED
}

/// The current thread `me`, armed ([`arm`]) and findable, waits until notified or until TSC
/// `deadline`. At the deadline (the timer fires a little early; the rest is spun, yielding)
/// `leave` runs: under the list's lock it takes `me` off the list if
/// [`timed_out_under_lock`] and says whether it did. Returns whether the wait timed out.
pub(crate) fn wait(me: &Tcb, deadline: u64, leave: impl FnOnce() -> bool) -> bool {
    sched::wait(me);
    let timed_out = if notified(me) {
        // The notifier took us off its list; cancel the timeout.
        timer::remove_sleeper(me);
        false
    } else {
        timer::spin_until(deadline, || notified(me));
        leave()
    };
    me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
    timed_out
}

/// The current thread `me` armed a timed wait ([`arm`]) but will not wait after all (it was
/// never findable by a notifier): takes it off the sleepers' list, absorbing the timer's
/// wake-up if the timer already claimed it.
pub(crate) fn disarm(me: &Tcb) {
    if take_armed(me) {
        timer::remove_sleeper(me);
    } else {
        // The timer claimed it and wakes it (or did): take that wake-up.
        sched::wait(me);
    }
    me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
}
