//! [`Condvar`] (`std::sync::Condvar`): waiters queue up (before they release the mutex, so no
//! notification is lost), park, and re-take the mutex when woken. Waits never wake spuriously
//! here, but callers should loop as with std.

use core::fmt;
use core::time::Duration;

use activm_stub::sync::SpinLock;

use super::mutex::MutexGuard;
use super::timed;
use super::waitq::WaitList;
use super::LockResult;
use crate::time::Instant;
use crate::{sched, timer};

pub struct Condvar {
    waiters: SpinLock<WaitList>,
}

/// Whether `wait_timeout` timed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar {
            waiters: SpinLock::new(WaitList::new()),
        }
    }

    /// Releases the guard's mutex, waits for a notification, re-acquires the mutex.
    pub fn wait<'a, T: ?Sized>(&self, guard: MutexGuard<'a, T>) -> LockResult<MutexGuard<'a, T>> {
        let mutex = guard.mutex();
        let me = sched::current();
        {
            let mut q = self.waiters.lock();
            me.prepare_wait();
            q.push(me, 0);
        }
        drop(guard);
        sched::wait(me);
        mutex.raw().lock();
        // SAFETY: the lock was just taken.
        Ok(unsafe { MutexGuard::from_locked(mutex) })
    }

    /// Waits while `condition` holds.
    pub fn wait_while<'a, T, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: F,
    ) -> LockResult<MutexGuard<'a, T>>
    where
        F: FnMut(&mut T) -> bool,
    {
        while condition(&mut *guard) {
            guard = self.wait(guard)?;
        }
        Ok(guard)
    }

    /// Like `wait`, giving up after `dur`. The waiter parks on the runtime's sleepers' list as
    /// well as in this condvar's wait list (see `timed`): the timeout wakes it exactly once, a
    /// notification before the deadline cancels the timeout. Nothing polls (the timer fires a
    /// little early and the waiter spins, yielding, the last few microseconds).
    pub fn wait_timeout<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let mutex = guard.mutex();
        let me = sched::current();
        let deadline = timer::deadline_in(dur);
        timed::arm(me, deadline);
        self.waiters.lock().push(me, 0);
        drop(guard);
        let timed_out = timed::wait(me, deadline, || {
            let mut q = self.waiters.lock();
            if timed::timed_out_under_lock(me) {
                // Nobody took us off the wait list (that happens under this lock).
                let found = q.remove(me);
                assert!(found, "a timed-out waiter was not in its wait list");
                true
            } else {
                false
            }
        });
        mutex.raw().lock();
        // SAFETY: the lock was just taken.
        Ok((
            unsafe { MutexGuard::from_locked(mutex) },
            WaitTimeoutResult(timed_out),
        ))
    }

    /// Waits while `condition` holds, at most `dur` in all (`std`'s `wait_timeout_while`): the
    /// result says it timed out if `condition` still held when the time was up.
    pub fn wait_timeout_while<'a, T, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        dur: Duration,
        mut condition: F,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)>
    where
        F: FnMut(&mut T) -> bool,
    {
        let start = Instant::now();
        while condition(&mut *guard) {
            let Some(left) = dur.checked_sub(start.elapsed()) else {
                return Ok((guard, WaitTimeoutResult(true)));
            };
            guard = self.wait_timeout(guard, left)?.0;
        }
        Ok((guard, WaitTimeoutResult(false)))
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        let mut q = self.waiters.lock();
        let Some(t) = q.pop() else {
            return;
        };
        let wake = timed::claim(t);
        drop(q);
        if wake {
            sched::wake(t);
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        let mut q = self.waiters.lock();
        let mut to_wake = WaitList::new();
        while let Some(t) = q.pop() {
            if timed::claim(t) {
                to_wake.push(t, 0);
            }
        }
        drop(q);
        for t in to_wake {
            sched::wake(t);
        }
    }
}

impl Default for Condvar {
    fn default() -> Condvar {
        Condvar::new()
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}
