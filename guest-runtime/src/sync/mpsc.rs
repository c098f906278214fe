//! Multi-producer, single-consumer channels (`std::sync::mpsc`): [`channel`] (unbounded) and
//! [`sync_channel`] (bounded; senders wait while it is full).

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use core::fmt;

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use crate::sched;
use crate::tcb::Tcb;

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiver: bool,
    /// The receiver, when it waits.
    waiting: Option<&'static Tcb>,
    /// Bounded channels: the capacity, and senders waiting for room.
    bound: Option<usize>,
    full: WaitList,
}

struct Chan<T> {
    state: SpinLock<State<T>>,
}

fn new_chan<T>(bound: Option<usize>) -> (Sender<T>, Receiver<T>) {
    let chan = Arc::new(Chan {
        state: SpinLock::new(State {
            queue: VecDeque::new(),
            senders: 1,
            receiver: true,
            waiting: None,
            bound,
            full: WaitList::new(),
        }),
    });
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// An unbounded channel.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    new_chan(None)
}

/// A channel holding at most `bound` messages (`bound` 0 is treated as 1).
pub fn sync_channel<T>(bound: usize) -> (SyncSender<T>, Receiver<T>) {
    let (tx, rx) = new_chan(Some(bound.max(1)));
    (SyncSender(tx), rx)
}

/// The receiving side is gone; the message comes back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a closed channel")
    }
}

/// Every sender is gone and the channel is empty.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct RecvError;

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("receiving on a closed channel")
    }
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum TryRecvError {
    Empty,
    Disconnected,
}

pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

// SAFETY: a sender only moves `T: Send` values into the channel.
unsafe impl<T: Send> Send for Sender<T> {}
// SAFETY: as above (all access under the channel lock).
unsafe impl<T: Send> Sync for Sender<T> {}

impl<T> Sender<T> {
    /// Sends `value`; fails if the receiver is gone.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        let mut value = Some(value);
        loop {
            let (wake, wait) = {
                let mut st = self.chan.state.lock();
                if !st.receiver {
                    return Err(SendError(value.take().expect("value")));
                }
                if let Some(bound) = st.bound {
                    if st.queue.len() < bound && st.queue.len() == st.queue.capacity() {
                        let cap = st.queue.capacity();
                        drop(st);
                        self.grow(cap);
                        continue;
                    }
                    if st.queue.len() >= bound {
                        let me = sched::current();
                        me.prepare_wait();
                        st.full.push(me, 0);
                        (None, Some(me))
                    } else {
                        st.queue.push_back(value.take().expect("value"));
                        (st.waiting.take(), None)
                    }
                } else if st.queue.len() == st.queue.capacity() {
                    // Grow the buffer with the lock dropped: nothing is allocated under a
                    // spinlock (see `docs/runtime.md`).
                    let cap = st.queue.capacity();
                    drop(st);
                    self.grow(cap);
                    continue;
                } else {
                    st.queue.push_back(value.take().expect("value"));
                    (st.waiting.take(), None)
                }
            };
            if let Some(me) = wait {
                sched::wait(me);
                continue;
            }
            if let Some(t) = wake {
                sched::wake(t);
            }
            return Ok(());
        }
    }
}

impl<T> Sender<T> {
    /// Replaces a full buffer of capacity `cap` by a bigger one, allocating with no lock held.
    fn grow(&self, cap: usize) {
        let mut bigger = VecDeque::with_capacity((cap * 2).max(16));
        let old = {
            let mut st = self.chan.state.lock();
            if st.queue.capacity() != cap {
                return; // someone else grew it
            }
            bigger.extend(st.queue.drain(..));
            core::mem::replace(&mut st.queue, bigger)
        };
        // The old buffer is freed with the lock dropped too.
        drop(old);
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        self.chan.state.lock().senders += 1;
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let wake = {
            let mut st = self.chan.state.lock();
            st.senders -= 1;
            if st.senders == 0 {
                st.waiting.take()
            } else {
                None
            }
        };
        if let Some(t) = wake {
            sched::wake(t);
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sender { .. }")
    }
}

/// The sending side of a bounded channel.
pub struct SyncSender<T>(Sender<T>);

impl<T> SyncSender<T> {
    /// Sends `value`, waiting while the channel is full.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.0.send(value)
    }
}

impl<T> Clone for SyncSender<T> {
    fn clone(&self) -> SyncSender<T> {
        SyncSender(self.0.clone())
    }
}

impl<T> fmt::Debug for SyncSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SyncSender { .. }")
    }
}

pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

// SAFETY: the receiver only takes `T: Send` values out of the channel.
unsafe impl<T: Send> Send for Receiver<T> {}

impl<T> Receiver<T> {
    /// Waits for a message; fails once every sender is gone and the channel is empty.
    pub fn recv(&self) -> Result<T, RecvError> {
        loop {
            let me = {
                let mut st = self.chan.state.lock();
                if let Some(v) = st.queue.pop_front() {
                    let room = st.full.pop();
                    drop(st);
                    if let Some(t) = room {
                        sched::wake(t);
                    }
                    return Ok(v);
                }
                if st.senders == 0 {
                    return Err(RecvError);
                }
                let me = sched::current();
                me.prepare_wait();
                st.waiting = Some(me);
                me
            };
            sched::wait(me);
        }
    }

    /// A message if one is there now.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut st = self.chan.state.lock();
        match st.queue.pop_front() {
            Some(v) => {
                let room = st.full.pop();
                drop(st);
                if let Some(t) = room {
                    sched::wake(t);
                }
                Ok(v)
            }
            None if st.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Iterates until every sender is gone.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let blocked = {
            let mut st = self.chan.state.lock();
            st.receiver = false;
            st.full.take_all()
        };
        for t in blocked {
            sched::wake(t);
        }
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receiver { .. }")
    }
}

/// See [`Receiver::iter`].
#[derive(Debug)]
pub struct Iter<'a, T> {
    rx: &'a Receiver<T>,
}

impl<T> Iterator for Iter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.rx.recv().ok()
    }
}

impl<'a, T> IntoIterator for &'a Receiver<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}
