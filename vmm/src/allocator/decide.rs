//! The allocator's decision: shares from demands, then the revokes and grants that reach them.

use std::time::Instant;

use super::{place, tiered_shares, GuestId, Slot, State};

/// The shares of the guests: the budget is split among the guests of normal priority, and
/// again among those at the host's idle priority (scavengers: their vCPU threads run only
/// where the others leave a CPU idle, so they take no processor from them; `place.rs`).
fn shares(state: &State) -> Vec<usize> {
    let tier = |scavengers: bool| -> Vec<(usize, bool)> {
        (0..state.guests.len())
            .map(|id| {
                let g = &state.guests[id];
                if state.placement.is_idle(id) == scavengers {
                    (g.demand(), g.latency_critical)
                } else {
                    (0, false)
                }
            })
            .collect()
    };
    let normal = tiered_shares(state.budget, &tier(false), state.rotation);
    let scavenging = tiered_shares(state.budget, &tier(true), state.rotation);
    normal.iter().zip(scavenging).map(|(a, b)| a + b).collect()
}

/// Processors of `scavengers`' tier (see [`shares`]) that no guest of it holds.
fn free_in_tier(state: &State, scavengers: bool) -> usize {
    let held: usize = (0..state.guests.len())
        .filter(|&id| state.placement.is_idle(id) == scavengers)
        .map(|id| state.guests[id].holding())
        .sum();
    state.budget.saturating_sub(held)
}

/// Recompute the shares, mark revokes and grants, and wake the threads of the vCPUs granted
/// a processor or told to hand over; returns the vCPUs to kick.
pub(super) fn decide(state: &mut State, now: Instant) -> Vec<(GuestId, usize)> {
    let shares = shares(state);
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
    // Grant free processors to the guests furthest below their share, in each tier.
    let mut free = [free_in_tier(state, false), free_in_tier(state, true)];
    let tier: Vec<usize> = (0..state.guests.len())
        .map(|id| usize::from(state.placement.is_idle(id)))
        .collect();
    let prefer = state.prefer_new;
    let mut granted = Vec::new();
    while let Some((id, g)) = state
        .guests
        .iter_mut()
        .enumerate()
        .filter(|(id, g)| free[tier[*id]] > 0 && g.holding() < g.share)
        .max_by_key(|(_, g)| g.share - g.holding())
    {
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
        free[tier[id]] -= 1;
    }
    // Bound to their processors' host CPUs before they wake (`place.rs`).
    place::place_granted(state, &granted);
    for (id, i) in granted {
        state.guests[id].wake[i].notify_one();
    }
    kicks
}
