//! [`Condvar`] (`std::sync::Condvar`): waiters queue up (before they release the mutex, so no
//! notification is lost), park, and re-take the mutex when woken. Waits never wake spuriously
//! here, but callers should loop as with std.

use core::fmt;
use core::time::Duration;

use activm_stub::sync::SpinLock;

use super::mutex::MutexGuard;
use super::waitq::WaitList;
use super::LockResult;
use crate::sched;
use crate::tcb;

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
        tcb::wait(me);
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

    /// Like `wait`, giving up after `dur`. The waiting thread polls (yielding to other threads,
    /// spinning if there are none): timed waits are not on this runtime's fast path.
    pub fn wait_timeout<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let mutex = guard.mutex();
        let me = sched::current();
        {
            let mut q = self.waiters.lock();
            me.prepare_wait();
            q.push(me, 0);
        }
        drop(guard);
        let deadline = crate::arch::cpu::rdtsc() + crate::timer::ns_to_ticks(dur.as_nanos() as u64);
        let mut timed_out = false;
        while me.wake.load(core::sync::atomic::Ordering::Acquire) != tcb::WOKEN {
            if crate::arch::cpu::rdtsc() >= deadline {
                // Leave the queue if nobody took us out of it yet.
                let mut q = self.waiters.lock();
                let mut kept = WaitList::new();
                let mut found = false;
                for t in q.take_all() {
                    if core::ptr::eq(t, me) {
                        found = true;
                    } else {
                        kept.push(t, t.tag.get());
                    }
                }
                *q = kept;
                drop(q);
                if found {
                    timed_out = true;
                    break;
                }
                // A notifier took us: its wake-up is on its way.
                tcb::wait(me);
                break;
            }
            if crate::sched::runnable_elsewhere() {
                crate::sched::yield_current();
            } else {
                core::hint::spin_loop();
                activm_stub::preempt::check_pending();
            }
        }
        mutex.raw().lock();
        // SAFETY: the lock was just taken.
        Ok((
            unsafe { MutexGuard::from_locked(mutex) },
            WaitTimeoutResult(timed_out),
        ))
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        let next = self.waiters.lock().pop();
        if let Some(t) = next {
            t.wake();
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        let all = self.waiters.lock().take_all();
        for t in all {
            t.wake();
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
