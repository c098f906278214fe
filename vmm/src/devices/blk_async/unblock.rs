//! UNBLOCKED records that wait only for the device's emulated latency: the request's data moved
//! inside the exit, its result is final and the thread's context was taken then, while the
//! blocked vCPU went on at once as a new activation (`vcpu/handoff.rs`,
//! `reenter_while_blocked`). The disk's timer thread delivers each at its due time.

use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

use super::{AsyncQueue, State};
use crate::activation::Event;
use crate::guest::Guest;

impl AsyncQueue {
    /// Deliver `event` (an UNBLOCKED whose result and context are final) at `due`.
    pub fn unblock_at(&self, guest: &Guest, due: Instant, event: Event) {
        let mut state = self.shared.lock();
        state.unblocks.push((due, event));
        self.shared.retime(&mut state, guest, false);
    }
}

/// When the earliest waiting UNBLOCKED is due.
pub(super) fn earliest(state: &State) -> Option<Instant> {
    state.unblocks.iter().map(|&(due, _)| due).min()
}

/// Take the UNBLOCKED records due by `now`, earliest first (equal times in the order the
/// requests blocked).
pub(super) fn take_due(state: &mut State, now: Instant) -> Vec<Event> {
    let mut due: Vec<(Instant, Event)> = Vec::new();
    let mut i = 0;
    while i < state.unblocks.len() {
        if state.unblocks[i].0 <= now {
            due.push(state.unblocks.remove(i));
        } else {
            i += 1;
        }
    }
    due.sort_by_key(|&(at, _)| at);
    due.into_iter().map(|(_, event)| event).collect()
}

/// Hand the due records to the guest (interrupting a vCPU only if one idles: `Guest::deliver`).
pub(super) fn deliver(guest: &Guest, events: Vec<Event>) {
    if events.is_empty() {
        return;
    }
    fence(Ordering::SeqCst);
    for event in events {
        guest.deliver(event);
    }
}
