//! Sleeping threads, on each vCPU's local APIC one-shot timer (`alarm` arms it, `sched::slice`
//! for time slices). When it fires, the handler (`dispatch::points::on_timer`) wakes due
//! sleepers, then preempts the running thread if its slice is over and something else waits,
//! otherwise re-arms for what is left.
//!
//! Sleepers wait in one global sorted list. The timer is armed `SLEEP_EARLY` before the earliest
//! deadline (it fires ~40 us late on our hosts) and the woken thread spins (yielding) to the
//! exact deadline.
//!
//! **Timed waits** (`Condvar::wait_timeout`) are sleepers too, and also wait in their
//! primitive's wait list: two parties may wake them, so the first to claim the wake-up in
//! `Tcb::timed` (compare-and-swap from [`TIMED_ARMED`], each under the lock of the list it found
//! the thread in) is the only one that wakes it. The timer's claim ([`TIMED_BY_TIMER`]) still
//! lets a notifier win until the waiter, at its deadline, leaves the wait list under that
//! list's lock; a notifier's claim ([`TIMED_NOTIFIED`]) cancels the timeout: the waiter takes
//! itself off the sleepers' list. Nothing polls.

use core::sync::atomic::Ordering;
use core::time::Duration;

use activm_stub::preempt;
use activm_stub::sync::{SpinGuard, SpinLock};

use crate::alarm::{ensure_armed_by, EARLIEST, SLEEP_EARLY_NS};
use crate::arch::cpu;
use crate::percpu;
pub use crate::percpu::{ns_to_ticks, ticks_to_ns};
use crate::sched;
use crate::tcb::{self, Tcb};

/// Sleeps shorter than this spin (yielding) instead of parking.
const SPIN_SLEEP_NS: u64 = 60_000;

/// Sleeping threads, earliest deadline first: an intrusive list through `Tcb::sleep_next`
/// (nothing is allocated under the lock; a thread is in it only while it sleeps, so its TCB
/// stays valid).
struct Sleepers(*const Tcb);

// SAFETY: TCB pointers, used under the lock.
unsafe impl Send for Sleepers {}

static SLEEPERS: percpu::Line<SpinLock<Sleepers>> =
    percpu::Line(SpinLock::new(Sleepers(core::ptr::null())));

/// `Tcb::timed`: not a timed wait (a plain sleep: only the timer wakes it).
pub const TIMED_NONE: u32 = 0;
/// A timed wait nobody claimed yet.
pub const TIMED_ARMED: u32 = 1;
/// The timer claimed it (its deadline is near) and woke it.
pub const TIMED_BY_TIMER: u32 = 2;
/// A notifier claimed it: not timed out.
pub const TIMED_NOTIFIED: u32 = 3;

/// Inserts `t` (sleeping until `t.sleep_deadline`) in deadline order.
fn insert_sleeper(list: &mut Sleepers, t: &Tcb) {
    let deadline = t.sleep_deadline.get();
    let mut prev: *const Tcb = core::ptr::null();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB.
        let c = unsafe { tcb::from_raw(cur) };
        if c.sleep_deadline.get() > deadline {
            break;
        }
        prev = cur;
        cur = c.sleep_next.get();
    }
    t.sleep_next.set(cur);
    if prev.is_null() {
        list.0 = t;
    } else {
        // SAFETY: as above.
        unsafe { tcb::from_raw(prev) }.sleep_next.set(t);
    }
}

/// Scheduler, before halting: wake up for the earliest sleeper.
pub fn arm_for_sleepers() {
    let earliest = EARLIEST.load(Ordering::Acquire);
    if earliest != u64::MAX {
        ensure_armed_by(earliest.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    }
}

/// Whether any thread sleeps (or waits with a timeout).
pub fn has_sleepers() -> bool {
    EARLIEST.load(Ordering::Acquire) != u64::MAX
}

/// Nanoseconds until the earliest sleeper is due (0 if one is due; `None` without sleepers).
pub fn ns_until_earliest() -> Option<u64> {
    let earliest = EARLIEST.load(Ordering::Acquire);
    (earliest != u64::MAX).then(|| ticks_to_ns(earliest.saturating_sub(cpu::rdtsc())))
}

/// Whether a sleeper is due (within the early margin).
#[inline]
pub fn sleepers_due() -> bool {
    let earliest = EARLIEST.load(Ordering::Relaxed);
    earliest != u64::MAX && earliest <= cpu::rdtsc() + ns_to_ticks(SLEEP_EARLY_NS)
}

/// Wakes every due sleeper (they become runnable on this vCPU).
pub fn wake_due() {
    wake_due_from(SLEEPERS.lock());
}

/// [`wake_due`] for a scheduler: nothing if the sleepers' lock is taken. A scheduler spins for
/// no lock it can do without (its holder may be a scheduler context queued for adoption behind
/// it: docs/activations.md, run 147); the due sleepers keep [`sleepers_due`] true, so the
/// scheduler loop comes back through its loop top, which adopts.
pub fn try_wake_due() {
    if let Some(list) = SLEEPERS.try_lock() {
        wake_due_from(list);
    }
}

fn wake_due_from(list: SpinGuard<'_, Sleepers>) {
    let limit = cpu::rdtsc() + ns_to_ticks(SLEEP_EARLY_NS);
    let due = {
        let mut list = list;
        // Cut the due prefix off; keep those whose wake-up the timer claims (a notifier may
        // have claimed a timed waiter first: it is only dropped from the list, not touched
        // again once the lock is released).
        let mut due: *const Tcb = core::ptr::null();
        let mut due_tail: *const Tcb = core::ptr::null();
        let mut cur = list.0;
        while !cur.is_null() {
            // SAFETY: a sleeping thread's TCB.
            let c = unsafe { tcb::from_raw(cur) };
            if c.sleep_deadline.get() > limit {
                break;
            }
            let next = c.sleep_next.get();
            let claimed = c.timed.load(Ordering::Acquire) == TIMED_NONE
                || c.timed
                    .compare_exchange(
                        TIMED_ARMED,
                        TIMED_BY_TIMER,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok();
            if claimed {
                c.sleep_next.set(core::ptr::null());
                if due_tail.is_null() {
                    due = cur;
                } else {
                    // SAFETY: a TCB this loop took.
                    unsafe { tcb::from_raw(due_tail) }.sleep_next.set(cur);
                }
                due_tail = cur;
            }
            cur = next;
        }
        list.0 = cur;
        update_earliest(&list);
        due
    };
    let mut cur = due;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB whose wake-up is ours (it cannot exit before it is
        // woken); read the link before the wake-up hands the TCB back to its thread.
        let t = unsafe { tcb::from_raw(cur) };
        cur = t.sleep_next.get();
        sched::wake(t);
    }
}

/// Sets `EARLIEST` from the list's head (under the lock).
fn update_earliest(list: &Sleepers) {
    let next = if list.0.is_null() {
        u64::MAX
    } else {
        // SAFETY: a sleeping thread's TCB.
        unsafe { tcb::from_raw(list.0) }.sleep_deadline.get()
    };
    EARLIEST.store(next, Ordering::Release);
    crate::activation::sa::publish_earliest_sleeper(next);
}

/// The TSC deadline `d` from now (saturating far in the future).
pub fn deadline_in(d: Duration) -> u64 {
    let ns = d.as_nanos().min(u128::from(u64::MAX / 4)) as u64;
    cpu::rdtsc().saturating_add(ns_to_ticks(ns))
}

/// Puts `me` (the current thread, after `prepare_wait`, with `timed` set) on the sleepers'
/// list until TSC `deadline`, and makes sure this vCPU's timer fires for it.
pub fn add_sleeper(me: &Tcb, deadline: u64) {
    me.sleep_deadline.set(deadline);
    {
        let mut list = SLEEPERS.lock();
        insert_sleeper(&mut list, me);
        EARLIEST.fetch_min(deadline, Ordering::AcqRel);
        crate::activation::sa::publish_earliest_sleeper(EARLIEST.load(Ordering::Acquire));
    }
    let hold = preempt::Hold::new();
    ensure_armed_by(deadline.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    drop(hold);
}

/// Takes `me` off the sleepers' list if it is still there (a timed wait a notifier ended).
pub fn remove_sleeper(me: &Tcb) {
    let target = me as *const Tcb;
    let mut list = SLEEPERS.lock();
    let mut prev: *const Tcb = core::ptr::null();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB.
        let c = unsafe { tcb::from_raw(cur) };
        let next = c.sleep_next.get();
        if cur == target {
            if prev.is_null() {
                list.0 = next;
                update_earliest(&list);
            } else {
                // SAFETY: as above.
                unsafe { tcb::from_raw(prev) }.sleep_next.set(next);
            }
            return;
        }
        prev = cur;
        cur = next;
    }
}

/// Spins (yielding to other threads) until TSC `deadline` or until `stop()`.
pub fn spin_until(deadline: u64, mut stop: impl FnMut() -> bool) {
    while cpu::rdtsc() < deadline && !stop() {
        if sched::runnable_elsewhere() {
            sched::yield_current();
        } else {
            core::hint::spin_loop();
            preempt::check_pending();
        }
    }
}

/// `thread::sleep`: parks the current thread until `d` has passed.
pub fn sleep(d: Duration) {
    let deadline = deadline_in(d);
    if d.as_nanos() >= u128::from(SPIN_SLEEP_NS) {
        let me = sched::current();
        me.prepare_wait();
        add_sleeper(me, deadline);
        sched::wait(me);
    }
    spin_until(deadline, || false);
}
