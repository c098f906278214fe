//! The allocator's decision: shares from demands, then the revokes and grants that reach them.

use std::time::Instant;

use super::{place, tiered_shares, GuestId, GuestState, Slot, State};

/// Recompute the shares, mark revokes and grants, and wake the threads of the vCPUs granted
/// a processor or told to hand over; returns the vCPUs to kick.
pub(super) fn decide(state: &mut State, now: Instant) -> Vec<(GuestId, usize)> {
    let demands: Vec<(usize, bool)> = state
        .guests
        .iter()
        .map(|g| (g.demand(), g.latency_critical))
        .collect();
    let shares = tiered_shares(state.budget, &demands, state.rotation);
    let quantum = state.quantum;
    let mut kicks = Vec::new();
    // Take processors away first (they come back through `release`).
    for (id, (g, share)) in state.guests.iter_mut().zip(&shares).enumerate() {
        g.share = *share;
        let holding = g.holding();
        let revoking = g.vcpus.iter().filter(|s| **s == Slot::Revoking).count();
        let mut excess = holding.saturating_sub(*share).saturating_sub(revoking);
        // Most recently started first: the longest-running activations are left alone.
        let mut running = g.since(|s| {
            if let Slot::Running(t) = s {
                Some(*t)
            } else {
                None
            }
        });
        running.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        for (i, _) in &running {
            if excess == 0 {
                break;
            }
            g.vcpus[*i] = Slot::Revoking;
            kicks.push((id, *i));
            excess -= 1;
        }
        // Oblivious time slicing: a vCPU that ran a whole quantum yields to one that waits.
        if !g.activations {
            let mut waiting = g.since(|s| {
                if let Slot::Runnable(t) = s {
                    Some(*t)
                } else {
                    None
                }
            });
            waiting.sort_by_key(|(_, t)| *t);
            running.sort_by_key(|(_, t)| *t);
            for ((_, _), (i, since)) in waiting.iter().zip(running.iter()) {
                if g.vcpus[*i] == Slot::Running(*since) && now.duration_since(*since) >= quantum {
                    g.vcpus[*i] = Slot::Revoking;
                    kicks.push((id, *i));
                }
            }
        }
    }
    // An activation guest's vCPU that waits to resume (descheduled before the guest took
    // upcalls, or without a hand-off) and has no processor coming hands its context over.
    for g in state.guests.iter_mut().filter(|g| g.activations) {
        let mut room = g.share.saturating_sub(g.holding());
        for (slot, wake) in g.vcpus.iter_mut().zip(&g.wake) {
            if let Slot::Runnable(_) = slot {
                if room > 0 {
                    room -= 1;
                } else {
                    *slot = Slot::HandOff;
                    wake.notify_one();
                }
            }
        }
    }
    // Grant free processors to the guests furthest below their share.
    let mut free = state
        .budget
        .saturating_sub(state.guests.iter().map(GuestState::holding).sum());
    let prefer = state.prefer_new;
    let mut granted = Vec::new();
    while free > 0 {
        let Some((id, g)) = state
            .guests
            .iter_mut()
            .enumerate()
            .filter(|(_, g)| g.holding() < g.share)
            .max_by_key(|(_, g)| g.share - g.holding())
        else {
            break;
        };
        // Oblivious (and activation vCPUs preempted silently): the longest waiter resumes.
        let waiter = g
            .since(|s| {
                if let Slot::Runnable(t) = s {
                    Some(*t)
                } else {
                    None
                }
            })
            .into_iter()
            .min_by_key(|(_, t)| *t)
            .map(|(i, _)| i);
        let slot = match waiter {
            Some(i) => Some((i, Slot::GrantedResume)),
            None if g.activations => {
                let parked = prefer
                    .filter(|&(pg, _)| pg == id)
                    .map(|(_, pv)| pv)
                    .into_iter()
                    .chain(g.wake_first)
                    .find(|&pv| g.vcpus[pv] == Slot::Parked)
                    .or_else(|| g.vcpus.iter().position(|s| *s == Slot::Parked));
                if parked.is_some() && parked == g.wake_first {
                    g.wake_first = None;
                }
                parked.map(|i| (i, Slot::GrantedNew))
            }
            None => None,
        };
        let Some((i, grant)) = slot else {
            // Nothing of this guest can take a processor; stop asking for it.
            g.share = g.holding();
            continue;
        };
        g.vcpus[i] = grant;
        granted.push((id, i));
        free -= 1;
    }
    // Bound to their processors' host CPUs before they wake (`place.rs`).
    place::place_granted(state, &granted);
    for (id, i) in granted {
        state.guests[id].wake[i].notify_one();
    }
    kicks
}
