//! [`Barrier`] (`std::sync::Barrier`): the last of `n` arrivals wakes the others and is the
//! leader.

use core::fmt;

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use crate::sched;

#[derive(Debug)]
struct State {
    arrived: usize,
    queue: WaitList,
}

pub struct Barrier {
    n: usize,
    state: SpinLock<State>,
}

/// Returned by [`Barrier::wait`].
#[derive(Debug)]
pub struct BarrierWaitResult(bool);

impl BarrierWaitResult {
    pub fn is_leader(&self) -> bool {
        self.0
    }
}

impl Barrier {
    pub const fn new(n: usize) -> Barrier {
        Barrier {
            n,
            state: SpinLock::new(State {
                arrived: 0,
                queue: WaitList::new(),
            }),
        }
    }

    /// Blocks until `n` threads have called `wait`.
    pub fn wait(&self) -> BarrierWaitResult {
        let me = {
            let mut st = self.state.lock();
            st.arrived += 1;
            if st.arrived >= self.n {
                st.arrived = 0;
                let all = st.queue.take_all();
                drop(st);
                for t in all {
                    sched::wake(t);
                }
                return BarrierWaitResult(true);
            }
            let me = sched::current();
            me.prepare_wait();
            st.queue.push(me, 0);
            me
        };
        sched::wait(me);
        BarrierWaitResult(false)
    }
}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier").field("n", &self.n).finish()
    }
}
