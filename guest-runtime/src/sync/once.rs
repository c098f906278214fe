//! [`Once`] (`std::sync::Once`): runs a closure exactly once; callers that arrive while it runs
//! park in a wait list (on the runtime, no spinning) until it is done.
//! Poisoning does not exist here (a panic ends the guest), so `call_once_force`'s
//! [`OnceState::is_poisoned`] is always false.

use core::fmt;
use core::sync::atomic::{AtomicU8, Ordering};

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use crate::sched;

const INCOMPLETE: u8 = 0;
const RUNNING: u8 = 1;
const COMPLETE: u8 = 2;

pub struct Once {
    state: AtomicU8,
    waiters: SpinLock<WaitList>,
}

/// What `call_once_force`'s closure learns (`std::sync::OnceState`).
#[derive(Debug)]
pub struct OnceState(());

impl OnceState {
    /// Always false: a panic ends the guest, so no `Once` is ever poisoned.
    pub fn is_poisoned(&self) -> bool {
        false
    }
}

impl Once {
    pub const fn new() -> Once {
        Once {
            state: AtomicU8::new(INCOMPLETE),
            waiters: SpinLock::new(WaitList::new()),
        }
    }

    /// Whether a `call_once` finished.
    #[inline]
    pub fn is_completed(&self) -> bool {
        self.state.load(Ordering::Acquire) == COMPLETE
    }

    /// Runs `f` if no call ran before; returns once one has run to completion (waiting for a
    /// call in progress on another thread).
    pub fn call_once<F: FnOnce()>(&self, f: F) {
        if self.is_completed() {
            return;
        }
        let mut f = Some(f);
        self.call_slow(&mut |_| f.take().expect("the closure runs once")());
    }

    /// Like `call_once`; the closure gets an [`OnceState`].
    pub fn call_once_force<F: FnOnce(&OnceState)>(&self, f: F) {
        if self.is_completed() {
            return;
        }
        let mut f = Some(f);
        self.call_slow(&mut |state| f.take().expect("the closure runs once")(state));
    }

    /// Returns once a call has completed (`std::sync::Once::wait`), without running one.
    pub fn wait(&self) {
        if !self.is_completed() {
            self.park_until_complete();
        }
    }

    #[cold]
    fn call_slow(&self, f: &mut dyn FnMut(&OnceState)) {
        match self
            .state
            .compare_exchange(INCOMPLETE, RUNNING, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => {
                f(&OnceState(()));
                self.state.store(COMPLETE, Ordering::Release);
                let all = self.waiters.lock().take_all();
                for t in all {
                    sched::wake(t);
                }
            }
            Err(COMPLETE) => {}
            // Running elsewhere: it completes (a panic would end the guest).
            Err(_) => self.park_until_complete(),
        }
    }

    /// Parks until a call has completed.
    fn park_until_complete(&self) {
        let me = sched::current();
        loop {
            {
                let mut q = self.waiters.lock();
                // Checked under the lock the completing thread takes to wake the waiters.
                if self.is_completed() {
                    return;
                }
                me.prepare_wait();
                q.push(me, 0);
            }
            sched::wait(me);
        }
    }
}

impl Default for Once {
    fn default() -> Once {
        Once::new()
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once")
            .field("completed", &self.is_completed())
            .finish_non_exhaustive()
    }
}
