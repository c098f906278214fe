//! Timed wake-ups of latency-critical guests, carried out by the running vCPU thread of the
//! guest that loses its processor for them (see [`Allocator::yield_until`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Allocator, GuestId, Slot};

impl Allocator {
    /// `vcpu` of `guest` was just given back (`sa_yield`) until `at`, when the guest's earliest
    /// timer is due. A latency-critical guest must get a processor then without waiting for
    /// the host to schedule the parked vCPU's thread (on a busy host, a sleeping thread's
    /// wake-up can wait milliseconds behind running vCPU threads). So the wake-up is
    /// recorded, and the vCPU of another guest that would lose its processor for it is
    /// returned, for the caller to kick at `at` ([`VcpuControl::kick_at`]): that thread is
    /// running, so it acts at once ([`Allocator::fire_due_wakes`]) and frees its own
    /// processor. `None`: nothing to arm (not latency-critical, or nobody to take from); the
    /// parked vCPU's own deadline does it ([`Allocator::acquire_until`]).
    ///
    /// [`VcpuControl::kick_at`]: crate::kick::VcpuControl::kick_at
    pub fn yield_until(
        &self,
        guest: GuestId,
        vcpu: usize,
        at: Instant,
    ) -> Option<(GuestId, usize)> {
        let mut state = self.lock();
        let g = &state.guests[guest];
        if !g.latency_critical || !g.activations || g.vcpus[vcpu] != Slot::Parked {
            return None;
        }
        // The processor the shares would take: a best-effort guest's most recently started.
        let victim = state
            .guests
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.latency_critical)
            .flat_map(|(id, g)| {
                g.vcpus
                    .iter()
                    .enumerate()
                    .filter_map(move |(v, s)| match s {
                        Slot::Running(t) => Some((*t, id, v)),
                        _ => None,
                    })
            })
            .max_by_key(|(t, _, _)| *t)
            .map(|(_, id, v)| (id, v))?;
        state.timed_wakes.retain(|w| (w.1, w.2) != (guest, vcpu));
        state.timed_wakes.push((at, guest, vcpu));
        self.wakes_pending.store(true, Ordering::Release);
        Some(victim)
    }

    /// On a kicked vCPU thread: the yielded vCPUs whose wake-up time has come get their
    /// processor back ([`Allocator::wake_for_timer`]). Returns the vCPUs to kick (perhaps the
    /// caller's own).
    pub fn fire_due_wakes(&self) -> Vec<(GuestId, usize)> {
        if !self.wakes_pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let now = Instant::now();
        let due: Vec<(GuestId, usize)> = {
            let mut state = self.lock();
            let mut due = Vec::new();
            let state = &mut *state;
            let guests = &mut state.guests;
            state.timed_wakes.retain(|&(at, g, v)| {
                if at <= now {
                    if guests[g].vcpus[v] == Slot::Parked {
                        guests[g].wakes_fired += 1;
                    }
                    due.push((g, v));
                    false
                } else {
                    true
                }
            });
            // Drop the wake-ups of vCPUs that got a processor some other way.
            let guests = &state.guests;
            state
                .timed_wakes
                .retain(|&(_, g, v)| guests[g].vcpus[v] == Slot::Parked);
            self.wakes_pending
                .store(!state.timed_wakes.is_empty(), Ordering::Release);
            due
        };
        due.into_iter()
            .flat_map(|(g, v)| self.wake_for_timer(g, v))
            .collect()
    }
}
