//! Multi-producer, single-consumer channels (`std::sync::mpsc`): [`channel`] (unbounded) and
//! [`sync_channel`] (bounded: senders wait while it is full; bound 0 is a rendezvous, where
//! `send` returns only once the receiver took the message).
//!
//! Dropping the [`Receiver`] disconnects the senders and drops the messages still queued (as
//! std does), so a reply sender inside one disconnects its own receiver at once.

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use core::fmt;
use core::time::Duration;

use activm_stub::sync::SpinLock;

use super::timed;
use super::waitq::WaitList;
use crate::tcb::Tcb;
use crate::{sched, timer};

mod error;
mod iter;

pub use error::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};
pub use iter::{IntoIter, Iter, TryIter};

/// `State::full` tags: a sender waiting for room, or (rendezvous) for its message to be taken.
const WAITS_FOR_ROOM: usize = 0;
const WAITS_FOR_TAKER: usize = 1;

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiver: bool,
    /// The receiver, when it waits.
    waiting: Option<&'static Tcb>,
    /// Bounded channels: the capacity (0: rendezvous), and senders waiting.
    bound: Option<usize>,
    full: WaitList,
    /// Messages the receiver has taken so far (a rendezvous sender waits for its own).
    received: u64,
}

impl<T> State<T> {
    /// Whether a sender may queue a message now (`blocking`: it will wait until the message is
    /// taken, which a rendezvous needs unless the receiver already waits).
    fn has_room(&self, blocking: bool) -> bool {
        match self.bound {
            None => true,
            Some(0) => self.queue.is_empty() && (blocking || self.waiting.is_some()),
            Some(bound) => self.queue.len() < bound,
        }
    }

    /// The receiver's wake-up, if it waits and this caller claims it (see `timed`).
    fn take_receiver(&mut self) -> Option<&'static Tcb> {
        self.waiting.take().filter(|t| timed::claim(t))
    }

    /// Takes the oldest message, with the senders to wake (after the lock is dropped).
    fn pop(&mut self) -> Option<(T, WaitList)> {
        let v = self.queue.pop_front()?;
        self.received += 1;
        let mut wake = WaitList::new();
        if self.bound == Some(0) {
            // The sender whose message this was, and any waiting for room: they check again.
            wake = self.full.take_all();
        } else if let Some(t) = self.full.pop() {
            wake.push(t, WAITS_FOR_ROOM);
        }
        Some((v, wake))
    }
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
            received: 0,
        }),
    });
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// An unbounded channel.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    new_chan(None)
}

/// A channel holding at most `bound` messages; `bound` 0 makes every `send` a rendezvous with
/// a `recv`.
pub fn sync_channel<T>(bound: usize) -> (SyncSender<T>, Receiver<T>) {
    let (tx, rx) = new_chan(Some(bound));
    (SyncSender(tx), rx)
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
        self.push(value, true).map_err(|e| match e {
            TrySendError::Full(v) | TrySendError::Disconnected(v) => SendError(v),
        })
    }

    /// Queues `value`: waiting for room (bounded) and, on a rendezvous, for the receiver to take
    /// it, if `blocking`; else `Full` when it would wait.
    fn push(&self, value: T, blocking: bool) -> Result<(), TrySendError<T>> {
        loop {
            let mut st = self.chan.state.lock();
            if !st.receiver {
                return Err(TrySendError::Disconnected(value));
            }
            if !st.has_room(blocking) {
                if !blocking {
                    return Err(TrySendError::Full(value));
                }
                let me = sched::current();
                me.prepare_wait();
                st.full.push(me, WAITS_FOR_ROOM);
                drop(st);
                sched::wait(me);
                continue;
            }
            if st.queue.len() == st.queue.capacity() {
                // Grow the buffer with the lock dropped: nothing is allocated under a
                // spinlock (see `docs/runtime.md`).
                let cap = st.queue.capacity();
                drop(st);
                self.grow(cap);
                continue;
            }
            st.queue.push_back(value);
            let mut receiver = st.take_receiver();
            if st.bound != Some(0) || !blocking {
                drop(st);
                if let Some(t) = receiver {
                    sched::wake(t);
                }
                return Ok(());
            }
            // A rendezvous: wait until the receiver took our message (the queue holds only it).
            let ticket = st.received + 1;
            loop {
                if st.received >= ticket {
                    return Ok(());
                }
                if !st.receiver {
                    // Gone without taking it: the message comes back.
                    let value = st
                        .queue
                        .pop_back()
                        .expect("a rendezvous message in transit");
                    return Err(TrySendError::Disconnected(value));
                }
                let me = sched::current();
                me.prepare_wait();
                st.full.push(me, WAITS_FOR_TAKER);
                drop(st);
                if let Some(t) = receiver.take() {
                    sched::wake(t);
                }
                sched::wait(me);
                st = self.chan.state.lock();
            }
        }
    }

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
                st.take_receiver()
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
    /// Sends `value`, waiting while the channel is full; on a rendezvous channel (bound 0)
    /// until the receiver took it. Fails if the receiver is gone (before it took the message).
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.0.send(value)
    }

    /// Sends `value` only if that needs no waiting: there is room, or (bound 0) the receiver
    /// is waiting in `recv`.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        self.0.push(value, false)
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

/// Wakes the senders `pop` let go.
fn wake_senders(list: WaitList) {
    for t in list {
        sched::wake(t);
    }
}

impl<T> Receiver<T> {
    /// Waits for a message; fails once every sender is gone and the channel is empty.
    pub fn recv(&self) -> Result<T, RecvError> {
        loop {
            let me = {
                let mut st = self.chan.state.lock();
                if let Some((v, senders)) = st.pop() {
                    drop(st);
                    wake_senders(senders);
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
        match st.pop() {
            Some((v, senders)) => {
                drop(st);
                wake_senders(senders);
                Ok(v)
            }
            None if st.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Waits for a message at most `timeout`. The receiver waits on the sleepers' list too;
    /// a sender and the timer claim its wake-up (`sync::timed`), so exactly one wakes it.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        match self.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        let deadline = timer::deadline_in(timeout);
        let mut timed_out = false;
        loop {
            let me = sched::current();
            if !timed_out {
                timed::arm(me, deadline);
            }
            let outcome = {
                let mut st = self.chan.state.lock();
                if let Some((v, senders)) = st.pop() {
                    Some((Ok(v), senders))
                } else if st.senders == 0 {
                    Some((Err(RecvTimeoutError::Disconnected), WaitList::new()))
                } else if timed_out {
                    Some((Err(RecvTimeoutError::Timeout), WaitList::new()))
                } else {
                    st.waiting = Some(me);
                    None
                }
            };
            if let Some((result, senders)) = outcome {
                if !timed_out {
                    timed::disarm(me);
                }
                wake_senders(senders);
                return result;
            }
            timed_out = timed::wait(me, deadline, || {
                let mut st = self.chan.state.lock();
                if timed::timed_out_under_lock(me) {
                    // Nobody took us out of `waiting` (that happens under this lock).
                    let was_me = st.waiting.take().is_some_and(|t| core::ptr::eq(t, me));
                    assert!(was_me, "a timed-out receiver was not the one waiting");
                    true
                } else {
                    false
                }
            });
            // Woken by a sender (or its drop) or timed out: look again (a message that came
            // at the deadline is still taken).
            timed_out = timed_out || crate::arch::cpu::rdtsc() >= deadline;
        }
    }

    /// Iterates, waiting for each message, until every sender is gone.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// Iterates over the messages there now, without waiting.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (blocked, queued) = {
            let mut st = self.chan.state.lock();
            st.receiver = false;
            let blocked = st.full.take_all();
            // A rendezvous sender takes its message back; every other queued message is
            // dropped now (with the lock dropped: a message's own drop may use channels).
            let queued = if blocked.contains_tag(WAITS_FOR_TAKER) {
                VecDeque::new()
            } else {
                core::mem::take(&mut st.queue)
            };
            (blocked, queued)
        };
        drop(queued);
        wake_senders(blocked);
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receiver { .. }")
    }
}
