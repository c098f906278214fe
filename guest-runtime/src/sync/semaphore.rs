//! [`Semaphore`]: a counting semaphore with FIFO hand-off (a release with waiters gives the
//! permit straight to the oldest one).

use core::fmt;

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use crate::sched;

#[derive(Debug)]
struct State {
    permits: usize,
    queue: WaitList,
}

pub struct Semaphore {
    state: SpinLock<State>,
}

impl Semaphore {
    pub const fn new(permits: usize) -> Semaphore {
        Semaphore {
            state: SpinLock::new(State {
                permits,
                queue: WaitList::new(),
            }),
        }
    }

    /// Takes a permit, waiting until one is available.
    pub fn acquire(&self) {
        let me = {
            let mut st = self.state.lock();
            if st.permits > 0 && st.queue.is_empty() {
                st.permits -= 1;
                return;
            }
            let me = sched::current();
            me.prepare_wait();
            st.queue.push(me, 0);
            me
        };
        // The releaser hands its permit over with the wake-up.
        sched::wait(me);
    }

    /// Takes a permit if one is available now.
    pub fn try_acquire(&self) -> bool {
        let mut st = self.state.lock();
        if st.permits > 0 && st.queue.is_empty() {
            st.permits -= 1;
            true
        } else {
            false
        }
    }

    /// Gives a permit back (to the oldest waiter, if any).
    pub fn release(&self) {
        let next = {
            let mut st = self.state.lock();
            let next = st.queue.pop();
            if next.is_none() {
                st.permits += 1;
            }
            next
        };
        if let Some(t) = next {
            sched::wake(t);
        }
    }

    /// Takes a permit, returned when the guard drops.
    pub fn access(&self) -> SemaphorePermit<'_> {
        self.acquire();
        SemaphorePermit { sem: self }
    }

    /// Permits available now (a snapshot).
    pub fn available_permits(&self) -> usize {
        self.state.lock().permits
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore").finish_non_exhaustive()
    }
}

/// A permit of a [`Semaphore`], given back on drop.
#[derive(Debug)]
pub struct SemaphorePermit<'a> {
    sem: &'a Semaphore,
}

impl Drop for SemaphorePermit<'_> {
    fn drop(&mut self) {
        self.sem.release();
    }
}
