//! Waiting for the allocator's decisions to be carried out: a control-socket request returns
//! when the vCPUs it granted run, or when every revoke and grant has been carried out.

use std::time::{Duration, Instant};

use super::{Allocator, GuestId, Slot, State};

impl Allocator {
    /// [`Allocator::set_concurrency`], also naming the vCPUs of `guest` that it granted a
    /// processor (for [`Allocator::wait_running`]).
    pub fn set_concurrency_granting(
        &self,
        guest: GuestId,
        n: usize,
    ) -> (usize, Vec<(GuestId, usize)>, Vec<usize>) {
        let mut state = self.lock();
        let g = &mut state.guests[guest];
        let previous = std::mem::replace(&mut g.concurrency, n.min(g.vcpus.len()));
        g.wanted = g.concurrency;
        let kicks = self.rebalance_locked(&mut state, Instant::now());
        let granted = (state.guests[guest].vcpus.iter().enumerate())
            .filter(|(_, s)| matches!(s, Slot::GrantedNew | Slot::GrantedResume))
            .map(|(v, _)| v)
            .collect();
        (previous, kicks, granted)
    }

    /// Wait until each of `vcpus` of `guest`, granted a processor, has picked it up, at most
    /// `timeout`. Returns when the last one started running (or, if one already ran and left
    /// its processor again, when this saw it), `None` on timeout.
    pub fn wait_running(
        &self,
        guest: GuestId,
        vcpus: &[usize],
        timeout: Duration,
    ) -> Option<Instant> {
        self.wait_for(
            timeout,
            |_| {},
            |state| {
                let mut latest = None;
                for &v in vcpus {
                    match state.guests[guest].vcpus.get(v) {
                        Some(Slot::GrantedNew | Slot::GrantedResume) => return None,
                        Some(Slot::Running(since)) => latest = latest.max(Some(*since)),
                        _ => latest = latest.max(Some(Instant::now())),
                    }
                }
                Some(latest.unwrap_or_else(Instant::now))
            },
        )
    }

    /// Whether every decision has been carried out: no processor is being revoked and no grant
    /// is waiting to be picked up.
    pub fn settled(&self) -> bool {
        Self::settled_locked(&self.lock())
    }

    pub(super) fn settled_locked(state: &State) -> bool {
        state.guests.iter().all(|g| {
            g.vcpus
                .iter()
                .all(|s| !matches!(s, Slot::Revoking | Slot::GrantedNew | Slot::GrantedResume))
        })
    }

    /// Wait until [`Allocator::settled`], at most `timeout`. Returns when the change that
    /// settled it was made (the moment a granted vCPU picked up its processor or a revoked one
    /// handed its processor back), or `None` on timeout. Woken by that change, not by polling.
    pub fn wait_settled(&self, timeout: Duration) -> Option<Instant> {
        let forget_earlier = |state: &mut State| state.settled_at = None;
        self.wait_for(timeout, forget_earlier, |state| {
            Self::settled_locked(state).then(|| state.settled_at.unwrap_or_else(Instant::now))
        })
    }

    /// Waits, at most `timeout`, until `done` returns a value, checking it again at each
    /// [`Allocator::settle`] (a grant picked up, a processor given back); `None` on timeout.
    /// `begin` runs first, under the same lock that registers the waiter.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        begin: impl FnOnce(&mut State),
        mut done: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        state.settle_waiters += 1;
        begin(&mut state);
        let result = loop {
            if let Some(result) = done(&state) {
                break Some(result);
            }
            let now = Instant::now();
            if now >= deadline {
                break None;
            }
            state = self
                .settling
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        state.settle_waiters -= 1;
        result
    }

    /// A grant was picked up or a processor came back: wake whoever waits for that, and note
    /// when it settled.
    pub(super) fn settle(&self, state: &mut State) {
        if state.settle_waiters > 0 {
            if state.settled_at.is_none() && Self::settled_locked(state) {
                state.settled_at = Some(Instant::now());
            }
            self.settling.notify_all();
        }
    }
}
