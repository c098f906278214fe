//! The asynchronous queue's state ([`AsyncQueue`]): the disk owns it, and its I/O threads,
//! its timer thread and the vCPUs share it. What is done with it (`blk_async/`: starting
//! requests, posting completions, waking vCPUs) reaches the whole `Guest`, which owns the disk.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use protocol::blk::BLK_RING_CAPACITY;

use super::timerfd::TimerFd;
use crate::devices::blk::request::Request;

/// A guest's asynchronous request queue: owned by its `Disk`, shared with its I/O threads.
#[derive(Debug, Default)]
pub struct AsyncQueue {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) work: Condvar,
    /// The timer thread sleeps on it (set when the queue starts; `timer.rs`).
    pub(super) timer: OnceLock<TimerFd>,
    /// The submission ring's doorbell (set when the queue starts).
    pub(super) doorbell: OnceLock<vmm_sys_util::eventfd::EventFd>,
    /// Guest-physical address of its `BlkSubmitRing`, for a look without the lock.
    pub(super) submit_gpa: OnceLock<u64>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Guest-physical address of the guest's `BlkRing` (after `blk_ring_setup`).
    pub(super) ring: Option<u64>,
    /// Guest-physical address of its `BlkSubmitRing` (after `blk_submit_ring_setup`).
    pub(super) submit_ring: Option<u64>,
    /// The VMM's producer index (the ring's `head` is only ever written from it).
    pub(super) head: u32,
    /// Tags of requests in flight, one bit each.
    pub(super) in_flight: u64,
    pub(super) jobs: VecDeque<(Request, u32)>,
    pub(super) workers: usize,
    pub(super) waiting: usize,
    /// Completions whose data moved, waiting for their due time: (due, tag, result).
    pub(super) delayed: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    /// The queue's threads run ([`AsyncQueue::start`]).
    pub(super) started: bool,
    /// The halted vCPU whose thread will post the earliest due completion.
    pub(super) poller: Option<u32>,
    /// When to look whether the guest consumed the ring up to the head then (`nudge_us`).
    pub(super) nudge: Option<(Instant, u32)>,
    /// The timer thread sleeps (on its timerfd) until then (`None`: nothing to do).
    pub(super) timer_wakes_at: Option<Instant>,
    /// The timer thread sleeps: who changes its deadline re-arms it (`Shared::retime`).
    pub(super) timer_asleep: bool,
    /// When the submission ring was last looked at (`submit_ring.rs`).
    pub(super) last_look: Option<Instant>,
    /// The consumer thread is awake (the ring's `consumer` word is its own then).
    pub(super) consumer_awake: bool,
    /// What the ring's `consumer` word says (`None`: not set up).
    pub(super) announced: Option<u32>,
    /// UNBLOCKED records to deliver at their due time (`unblock.rs`).
    pub(super) unblocks: Vec<(Instant, crate::activation::Event)>,
    /// The disk is gone: I/O threads end.
    pub(super) closed: bool,
}

const _: () = assert!(BLK_RING_CAPACITY == 64, "in_flight is a 64-bit mask");

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
