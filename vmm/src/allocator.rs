//! The processor allocator: which vCPUs may run on the physical CPUs of the budget.
//!
//! This module is the whole policy (Anderson et al. 1992, section 4.1): a guest that uses activations tells
//! the allocator how many processors it can use (`sa_setconcurrency`) and gives back idle ones
//! (`sa_yield`); the allocator **space-shares** the budget among guests by demand (water-filling,
//! so nobody gets more than it asked for and leftovers go to those who want more) and
//! **time-slices** only when the total demand exceeds the budget: shares that do not divide
//! evenly rotate every quantum, and an oblivious guest's vCPUs take turns on its share.
//!
//! The allocator only decides; the vCPU threads act. A vCPU thread holds a processor while it
//! is `Running`; it waits in [`Allocator::acquire`] otherwise. To take a processor away the
//! allocator marks the vCPU `Revoking` and returns it from [`Allocator::rebalance`] for the
//! caller to kick; the vCPU thread hands its state over and calls [`Allocator::release`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A guest, by its index in the monitor.
pub type GuestId = usize;

/// Where a vCPU stands: the one state machine of a vCPU. The allocator moves it under its lock;
/// the vCPU thread learns of a change by waiting in [`Allocator::acquire`] or by a kick
/// (`kick.rs`: a revoke request flag, then a signal, so none is lost).
///
/// ```text
///                ┌──────────── rebalance: grant ────────────┐
///   Runnable ────┤                                          ▼
///   Parked ──────┴─► GrantedResume / GrantedNew ─ acquire ─► Running ─ rebalance ─► Revoking
///     ▲  ▲  ▲                                                │  │                      │
///     │  │  └──────────────── release(Yielded) ──────────────┘  └─ release(Blocked) ─┐ │
///     │  └─ release(Preempted), activations (context handed over) ◄──────────────────┼─┘
///     │     release(Preempted | Descheduled), oblivious ──► Runnable                 │
///     │     Runnable, activations, no processor coming ──► HandOff ─ acquire ─► Revoking
///     └──────── unblock (UNBLOCKED handed over; oblivious: Runnable) ◄── Blocked ◄───┘
///   any ─► Stopped (release(Stopped), or the guest is removed)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Holds a processor since the instant given.
    Running(Instant),
    /// Holds a processor but has been asked to give it back.
    Revoking,
    /// Wants a processor to continue where it was (oblivious time slicing).
    Runnable(Instant),
    /// Has no activation: can be started as a new one (NEWPROC) when the guest wants more.
    Parked,
    /// Granted a processor as a new activation, not yet picked up by its thread.
    GrantedNew,
    /// Granted a processor to continue where it was, not yet picked up by its thread.
    GrantedResume,
    /// Of an activation guest, waiting to resume with no processor for it: its thread must
    /// hand its context to the guest (PREEMPTED) and park.
    HandOff,
    /// Blocked in the VMM on a device request: holds no processor and cannot take one until
    /// the request completes ([`Allocator::unblock`]).
    Blocked,
    /// Done for good.
    Stopped,
}

impl Slot {
    /// Whether a vCPU in this state holds (or is about to take) a processor.
    fn holds_processor(&self) -> bool {
        matches!(
            self,
            Slot::Running(_) | Slot::Revoking | Slot::GrantedNew | Slot::GrantedResume
        )
    }
}

/// What a vCPU thread got from [`Allocator::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Run on from where the vCPU was.
    Resume,
    /// Start a new activation at the guest's upcall entry.
    NewActivation,
    /// No processor: hand the context over (PREEMPTED) and park.
    HandOff,
    /// The vCPU is stopped: end the thread.
    Exit,
}

/// Why a vCPU gives its processor back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Taken away after a revoke: oblivious vCPUs wait to resume, activation vCPUs park (their
    /// state was handed to the guest).
    Preempted,
    /// The guest gave it back (`sa_yield`): park.
    Yielded,
    /// Taken away without a hand-off: wait to resume where it was, whatever the guest's mode.
    Descheduled,
    /// The vCPU blocks in the VMM on a device request: its processor is free meanwhile.
    Blocked,
    /// The vCPU stopped for good.
    Stopped,
}

#[derive(Debug)]
struct GuestState {
    vcpus: Vec<Slot>,
    /// Whether the guest takes upcalls (`sa_enable` done and activations not disabled).
    activations: bool,
    /// Processors the guest says it can use (`sa_setconcurrency`, or a cap from `activm ctl`).
    concurrency: usize,
    /// Processors an activation guest wants now: `concurrency`, less one for every processor it
    /// gave back idle (`sa_yield`) since it last asked (Anderson et al. 1992, section 4.1: "this processor
    /// is idle" lowers its demand until it asks again).
    wanted: usize,
    /// The share computed by the last rebalance.
    share: usize,
    removed: bool,
    /// What each vCPU's thread waits on in [`Allocator::acquire`]: a grant wakes only the thread
    /// it concerns (with one condition variable for all, every parked vCPU of every guest woke,
    /// took the lock and went back to sleep at each grant).
    wake: Vec<Arc<Condvar>>,
}

impl GuestState {
    fn holding(&self) -> usize {
        self.vcpus.iter().filter(|s| s.holds_processor()).count()
    }

    /// (vCPU, instant) of every vCPU whose slot `pick` maps to an instant.
    fn since(&self, pick: impl Fn(&Slot) -> Option<Instant>) -> Vec<(usize, Instant)> {
        self.vcpus
            .iter()
            .enumerate()
            .filter_map(|(i, s)| pick(s).map(|t| (i, t)))
            .collect()
    }

    /// Processors this guest could use now.
    fn demand(&self) -> usize {
        if self.removed {
            return 0;
        }
        // A vCPU blocked in the VMM cannot run; the guest's other threads still can, on its
        // other vCPUs (new activations).
        let live = self
            .vcpus
            .iter()
            .filter(|s| !matches!(s, Slot::Stopped | Slot::Blocked))
            .count();
        if self.activations {
            self.concurrency.min(self.wanted).min(live)
        } else {
            // An oblivious guest wants every vCPU it has, up to the cap set from outside
            // (`activm ctl set-vcpus`): its vCPUs then take turns on fewer processors.
            self.vcpus
                .iter()
                .filter(|s| !matches!(s, Slot::Stopped | Slot::Parked | Slot::Blocked))
                .count()
                .min(self.concurrency)
        }
    }
}

#[derive(Debug)]
struct State {
    budget: usize,
    quantum: Duration,
    guests: Vec<GuestState>,
    /// Rotates which guests get the processors left over when shares do not divide evenly.
    rotation: usize,
    /// A parked vCPU to start first if its guest gets a new activation (one rebalance only).
    prefer_new: Option<(GuestId, usize)>,
    /// Threads in [`Allocator::wait_settled`].
    settle_waiters: usize,
}

/// The processor allocator (see the module comment).
#[derive(Debug)]
pub struct Allocator {
    state: Mutex<State>,
    /// Signalled when a grant is picked up or a revoked processor comes back, for
    /// [`Allocator::wait_settled`].
    settling: Condvar,
}

/// A snapshot of one guest, for `activm ctl` and `--stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestView {
    pub vcpus: Vec<Slot>,
    pub activations: bool,
    pub concurrency: usize,
    /// Activation guests: processors wanted now (see `GuestState::wanted`).
    pub wanted: usize,
    pub share: usize,
}

impl Allocator {
    pub fn new(budget: usize, quantum: Duration) -> Allocator {
        Allocator {
            state: Mutex::new(State {
                budget: budget.max(1),
                quantum,
                guests: Vec::new(),
                rotation: 0,
                prefer_new: None,
                settle_waiters: 0,
            }),
            settling: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register a guest whose vCPUs all want to run; returns its id.
    pub fn add_guest(&self, nr_vcpus: usize) -> GuestId {
        let mut state = self.lock();
        let now = Instant::now();
        state.guests.push(GuestState {
            vcpus: vec![Slot::Runnable(now); nr_vcpus],
            activations: false,
            concurrency: nr_vcpus,
            wanted: nr_vcpus,
            share: 0,
            removed: false,
            wake: (0..nr_vcpus).map(|_| Arc::new(Condvar::new())).collect(),
        });
        state.guests.len() - 1
    }

    pub fn budget(&self) -> usize {
        self.lock().budget
    }

    pub fn quantum(&self) -> Duration {
        self.lock().quantum
    }

    /// Change the number of physical CPUs; returns the vCPUs to kick.
    pub fn set_budget(&self, budget: usize) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        state.budget = budget.max(1);
        self.rebalance_locked(&mut state, Instant::now())
    }

    /// The guest starts or stops taking upcalls; returns the vCPUs to kick.
    pub fn set_activations(&self, guest: GuestId, on: bool) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        state.guests[guest].activations = on;
        self.rebalance_locked(&mut state, Instant::now())
    }

    /// `sa_setconcurrency`: returns the previous value and the vCPUs to kick.
    pub fn set_concurrency(&self, guest: GuestId, n: usize) -> (usize, Vec<(GuestId, usize)>) {
        let mut state = self.lock();
        let g = &mut state.guests[guest];
        let previous = std::mem::replace(&mut g.concurrency, n.min(g.vcpus.len()));
        g.wanted = g.concurrency;
        (previous, self.rebalance_locked(&mut state, Instant::now()))
    }

    /// The guest is over: every vCPU stops and its processors are free.
    pub fn remove_guest(&self, guest: GuestId) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        let g = &mut state.guests[guest];
        g.removed = true;
        for slot in &mut g.vcpus {
            *slot = Slot::Stopped;
        }
        for wake in &g.wake {
            wake.notify_one();
        }
        self.rebalance_locked(&mut state, Instant::now())
    }

    /// Block until `vcpu` of `guest` holds a processor (or is stopped).
    pub fn acquire(&self, guest: GuestId, vcpu: usize) -> Acquired {
        let mut state = self.lock();
        loop {
            let slot = &mut state.guests[guest].vcpus[vcpu];
            match *slot {
                Slot::Stopped => return Acquired::Exit,
                Slot::GrantedResume | Slot::Running(_) => {
                    *slot = Slot::Running(Instant::now());
                    self.settle(&state);
                    return Acquired::Resume;
                }
                Slot::GrantedNew => {
                    *slot = Slot::Running(Instant::now());
                    self.settle(&state);
                    return Acquired::NewActivation;
                }
                Slot::HandOff => {
                    // It gives the processor it briefly uses for the hand-off straight back.
                    *slot = Slot::Revoking;
                    return Acquired::HandOff;
                }
                Slot::Revoking | Slot::Runnable(_) | Slot::Parked | Slot::Blocked => {
                    let wake = Arc::clone(&state.guests[guest].wake[vcpu]);
                    state = wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Whether the allocator wants this vCPU's processor back.
    pub fn revoking(&self, guest: GuestId, vcpu: usize) -> bool {
        self.lock().guests[guest].vcpus[vcpu] == Slot::Revoking
    }

    /// `vcpu` gives its processor back; returns the vCPUs to kick.
    pub fn release(&self, guest: GuestId, vcpu: usize, why: Release) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        let activations = state.guests[guest].activations;
        if why == Release::Yielded && activations {
            let g = &mut state.guests[guest];
            // Idle: it wants what it holds without this processor, until it asks for more.
            g.wanted = g.holding() - usize::from(g.vcpus[vcpu].holds_processor());
        }
        let slot = &mut state.guests[guest].vcpus[vcpu];
        if *slot != Slot::Stopped {
            *slot = match why {
                Release::Stopped => Slot::Stopped,
                Release::Yielded => Slot::Parked,
                Release::Blocked => Slot::Blocked,
                Release::Preempted if activations => Slot::Parked,
                Release::Preempted | Release::Descheduled => Slot::Runnable(Instant::now()),
            };
        }
        let kicks = self.rebalance_locked(&mut state, Instant::now());
        self.settle(&state);
        kicks
    }

    /// The device request `vcpu` blocked on completed: an activation guest gets its context
    /// (UNBLOCKED), so the vCPU parks, and if the guest is owed a processor this very vCPU
    /// starts the new activation (returned `true`: the UNBLOCKED can ride in its queue); an
    /// oblivious vCPU waits to resume where it was. Also returns the vCPUs to kick.
    pub fn unblock(
        &self,
        guest: GuestId,
        vcpu: usize,
        handed_over: bool,
    ) -> (Vec<(GuestId, usize)>, bool) {
        let mut state = self.lock();
        let slot = &mut state.guests[guest].vcpus[vcpu];
        if *slot == Slot::Blocked {
            *slot = if handed_over {
                Slot::Parked
            } else {
                Slot::Runnable(Instant::now())
            };
        }
        state.prefer_new = Some((guest, vcpu));
        let kicks = self.rebalance_locked(&mut state, Instant::now());
        state.prefer_new = None;
        (kicks, state.guests[guest].vcpus[vcpu] == Slot::GrantedNew)
    }

    /// The guest has an event to deliver and no running vCPU: if it gave every processor back,
    /// it wants one again (the event goes out with that new activation). Returns the vCPUs to
    /// kick.
    pub fn want_one(&self, guest: GuestId) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        let g = &mut state.guests[guest];
        if !g.activations || g.wanted > 0 {
            return Vec::new();
        }
        g.wanted = 1;
        self.rebalance_locked(&mut state, Instant::now())
    }

    /// Recompute the shares and act on them; call every quantum. Returns the vCPUs to kick.
    pub fn rebalance(&self) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        state.rotation = state.rotation.wrapping_add(1);
        self.rebalance_locked(&mut state, Instant::now())
    }

    /// Whether every decision has been carried out: no processor is being revoked and no grant
    /// is waiting to be picked up.
    pub fn settled(&self) -> bool {
        Self::settled_locked(&self.lock())
    }

    fn settled_locked(state: &State) -> bool {
        state.guests.iter().all(|g| {
            g.vcpus
                .iter()
                .all(|s| !matches!(s, Slot::Revoking | Slot::GrantedNew | Slot::GrantedResume))
        })
    }

    /// Wait until [`Allocator::settled`], at most `timeout`; says whether it settled. Woken by
    /// the very change that settles it, not by polling.
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        state.settle_waiters += 1;
        let settled = loop {
            if Self::settled_locked(&state) {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            state = self
                .settling
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        state.settle_waiters -= 1;
        settled
    }

    /// A grant was picked up or a processor came back: wake whoever waits for that.
    fn settle(&self, state: &State) {
        if state.settle_waiters > 0 {
            self.settling.notify_all();
        }
    }

    pub fn view(&self, guest: GuestId) -> GuestView {
        let state = self.lock();
        let g = &state.guests[guest];
        GuestView {
            vcpus: g.vcpus.clone(),
            activations: g.activations,
            concurrency: g.concurrency,
            wanted: g.wanted,
            share: g.share,
        }
    }

    fn rebalance_locked(&self, state: &mut State, now: Instant) -> Vec<(GuestId, usize)> {
        let kicks = Self::decide(state, now);
        // A revoke may have been withdrawn or nothing may be left to do: either settles.
        self.settle(state);
        kicks
    }

    /// Recompute the shares, mark revokes and grants, and wake the threads of the vCPUs granted
    /// a processor or told to hand over; returns the vCPUs to kick.
    fn decide(state: &mut State, now: Instant) -> Vec<(GuestId, usize)> {
        let shares = water_fill(
            state.budget,
            &state
                .guests
                .iter()
                .map(GuestState::demand)
                .collect::<Vec<_>>(),
            state.rotation,
        );
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
                    if g.vcpus[*i] == Slot::Running(*since) && now.duration_since(*since) >= quantum
                    {
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
                None if g.activations => prefer
                    .filter(|&(pg, pv)| pg == id && g.vcpus[pv] == Slot::Parked)
                    .map(|(_, pv)| pv)
                    .or_else(|| g.vcpus.iter().position(|s| *s == Slot::Parked))
                    .map(|i| (i, Slot::GrantedNew)),
                None => None,
            };
            let Some((i, grant)) = slot else {
                // Nothing of this guest can take a processor; stop asking for it.
                g.share = g.holding();
                continue;
            };
            g.vcpus[i] = grant;
            g.wake[i].notify_one();
            free -= 1;
        }
        kicks
    }
}

/// Split `budget` processors among guests demanding `demands`: nobody gets more than its
/// demand, the rest is shared as evenly as possible, and when it does not divide evenly the
/// extra processors go to guests in an order that `rotation` turns.
pub fn water_fill(budget: usize, demands: &[usize], rotation: usize) -> Vec<usize> {
    let mut shares = vec![0; demands.len()];
    let mut left = budget;
    loop {
        let hungry: Vec<usize> = (0..demands.len())
            .filter(|&i| shares[i] < demands[i])
            .collect();
        if hungry.is_empty() || left == 0 {
            return shares;
        }
        let each = left / hungry.len();
        if each == 0 {
            // Fewer processors than hungry guests: hand them out in rotating order.
            for k in 0..left {
                shares[hungry[(rotation + k) % hungry.len()]] += 1;
            }
            return shares;
        }
        for &i in &hungry {
            let give = each.min(demands[i] - shares[i]);
            shares[i] += give;
            left -= give;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_respects_demand_and_budget() {
        assert_eq!(water_fill(4, &[1, 8], 0), vec![1, 3]);
        assert_eq!(water_fill(6, &[6, 6], 0), vec![3, 3]);
        assert_eq!(water_fill(8, &[2, 2], 0), vec![2, 2]);
        assert_eq!(water_fill(0, &[2, 2], 0), vec![0, 0]);
        let odd: Vec<Vec<usize>> = (0..2).map(|r| water_fill(3, &[4, 4], r)).collect();
        assert_eq!(odd[0].iter().sum::<usize>(), 3);
        assert_ne!(odd[0], odd[1], "the odd processor rotates");
    }

    #[test]
    fn everyone_runs_when_demand_fits() {
        let alloc = Allocator::new(4, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        let h = alloc.add_guest(2);
        assert!(alloc.rebalance().is_empty());
        for (guest, vcpu) in [(g, 0), (g, 1), (h, 0), (h, 1)] {
            assert_eq!(alloc.acquire(guest, vcpu), Acquired::Resume);
        }
    }

    #[test]
    fn oblivious_vcpus_take_turns() {
        let alloc = Allocator::new(1, Duration::ZERO);
        let g = alloc.add_guest(2);
        alloc.rebalance();
        let first = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
            0
        } else {
            1
        };
        assert_eq!(alloc.acquire(g, first), Acquired::Resume);
        // A quantum (zero here) later, the running vCPU is revoked for the waiting one.
        assert_eq!(alloc.rebalance(), vec![(g, first)]);
        alloc.release(g, first, Release::Preempted);
        assert_eq!(alloc.acquire(g, 1 - first), Acquired::Resume);
    }

    #[test]
    fn activation_guest_gets_new_activations_up_to_its_share() {
        let alloc = Allocator::new(2, Duration::from_millis(10));
        let g = alloc.add_guest(4);
        alloc.rebalance();
        let running: Vec<usize> = (0..4)
            .filter(|&v| alloc.view(g).vcpus[v] == Slot::GrantedResume)
            .collect();
        assert_eq!(running.len(), 2);
        for &v in &running {
            alloc.acquire(g, v);
        }
        alloc.set_activations(g, true);
        // Its idle vCPUs park; the running ones stay; no time slicing inside the guest.
        for v in (0..4).filter(|v| !running.contains(v)) {
            alloc.release(g, v, Release::Yielded);
        }
        assert!(alloc.rebalance().is_empty());
        // One yields (it is idle): its processor is not granted back to the guest...
        alloc.release(g, running[0], Release::Yielded);
        let view = alloc.view(g);
        assert_eq!((view.wanted, view.share), (1, 1));
        assert!(!view.vcpus.contains(&Slot::GrantedNew));
        // ... until it asks for more: a parked vCPU starts as a new activation.
        alloc.set_concurrency(g, 4);
        let view = alloc.view(g);
        assert_eq!(
            view.vcpus
                .iter()
                .filter(|s| **s == Slot::GrantedNew)
                .count(),
            1
        );
    }

    #[test]
    fn second_guest_takes_half_from_an_activation_guest() {
        let alloc = Allocator::new(2, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        alloc.set_activations(g, true);
        assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
        assert_eq!(alloc.acquire(g, 1), Acquired::Resume);
        let h = alloc.add_guest(1);
        let kicks = alloc.rebalance();
        assert_eq!(kicks.len(), 1, "one of g's processors is revoked");
        let (kg, kv) = kicks[0];
        assert_eq!(kg, g);
        alloc.release(g, kv, Release::Preempted);
        assert_eq!(alloc.view(g).vcpus[kv], Slot::Parked);
        assert_eq!(alloc.acquire(h, 0), Acquired::Resume);
        // h ends: g gets its processor back as a new activation.
        alloc.remove_guest(h);
        assert_eq!(alloc.acquire(g, kv), Acquired::NewActivation);
    }

    #[test]
    fn waiting_vcpus_hand_off_when_the_guest_enables_activations() {
        let alloc = Allocator::new(1, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        alloc.rebalance();
        let running = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
            0
        } else {
            1
        };
        assert_eq!(alloc.acquire(g, running), Acquired::Resume);
        alloc.set_activations(g, true);
        // The waiting vCPU will never get a processor: it must hand its context over.
        assert_eq!(alloc.acquire(g, 1 - running), Acquired::HandOff);
        alloc.release(g, 1 - running, Release::Preempted);
        assert_eq!(alloc.view(g).vcpus[1 - running], Slot::Parked);
    }

    #[test]
    fn concurrency_limits_an_activation_guest() {
        let alloc = Allocator::new(4, Duration::from_millis(10));
        let g = alloc.add_guest(4);
        alloc.set_activations(g, true);
        for v in 0..4 {
            alloc.acquire(g, v);
        }
        let (previous, kicks) = alloc.set_concurrency(g, 1);
        assert_eq!(previous, 4);
        assert_eq!(kicks.len(), 3);
    }

    #[test]
    fn a_cap_makes_an_oblivious_guest_share_fewer_processors() {
        let alloc = Allocator::new(4, Duration::from_millis(10));
        let g = alloc.add_guest(4);
        alloc.rebalance();
        for v in 0..4 {
            assert_eq!(alloc.acquire(g, v), Acquired::Resume);
        }
        let (_, kicks) = alloc.set_concurrency(g, 1);
        assert_eq!(
            kicks.len(),
            3,
            "three of its four vCPUs lose their processor"
        );
        assert_eq!(alloc.view(g).share, 1);
    }

    #[test]
    fn a_blocked_vcpu_frees_its_processor_for_a_new_activation() {
        let alloc = Allocator::new(1, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        alloc.set_activations(g, true);
        let running = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
            0
        } else {
            1
        };
        assert_eq!(alloc.acquire(g, running), Acquired::Resume);
        alloc.release(g, 1 - running, Release::Yielded);
        assert_eq!(alloc.view(g).vcpus[1 - running], Slot::Parked);
        // It blocks on I/O: the processor goes to the parked vCPU as a new activation.
        alloc.release(g, running, Release::Blocked);
        assert_eq!(alloc.view(g).vcpus[running], Slot::Blocked);
        assert_eq!(alloc.acquire(g, 1 - running), Acquired::NewActivation);
        // Its request completes: its context goes to the guest, it parks.
        let (_, restarts) = alloc.unblock(g, running, true);
        assert!(!restarts, "the guest holds its whole share");
        assert_eq!(alloc.view(g).vcpus[running], Slot::Parked);
        // The other activation yields (idle): nobody takes its processor until the guest asks.
        alloc.release(g, 1 - running, Release::Yielded);
        assert!(!alloc.view(g).vcpus.contains(&Slot::GrantedNew));
        alloc.set_concurrency(g, 2);
        assert!(alloc.view(g).vcpus.contains(&Slot::GrantedNew));
    }

    #[test]
    fn an_unblocked_vcpu_starts_the_activation_it_is_owed() {
        let alloc = Allocator::new(1, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        alloc.set_activations(g, true);
        let a = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
            0
        } else {
            1
        };
        let b = 1 - a;
        assert_eq!(alloc.acquire(g, a), Acquired::Resume);
        alloc.release(g, b, Release::Yielded);
        // A blocks: B takes its processor; then B blocks too.
        alloc.release(g, a, Release::Blocked);
        assert_eq!(alloc.acquire(g, b), Acquired::NewActivation);
        alloc.release(g, b, Release::Blocked);
        // A's request completes: A itself starts the new activation the guest is owed.
        let (_, restarts) = alloc.unblock(g, a, true);
        assert!(restarts);
        assert_eq!(alloc.view(g).vcpus[a], Slot::GrantedNew);
    }

    #[test]
    fn an_oblivious_blocked_vcpu_resumes_after_its_request() {
        let alloc = Allocator::new(2, Duration::from_millis(10));
        let g = alloc.add_guest(1);
        let h = alloc.add_guest(2);
        alloc.rebalance();
        assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
        alloc.release(g, 0, Release::Blocked);
        // Meanwhile the other guest may use both processors.
        assert_eq!(alloc.view(h).share, 2);
        let (_, restarts) = alloc.unblock(g, 0, false);
        assert!(!restarts);
        alloc.rebalance();
        assert!(matches!(
            alloc.view(g).vcpus[0],
            Slot::Runnable(_) | Slot::GrantedResume
        ));
    }

    #[test]
    fn an_idle_guest_gives_processors_to_a_busy_one() {
        let alloc = Allocator::new(2, Duration::from_millis(10));
        let idle = alloc.add_guest(2);
        let busy = alloc.add_guest(2);
        alloc.set_activations(idle, true);
        alloc.set_activations(busy, true);
        alloc.rebalance();
        for g in [idle, busy] {
            for v in 0..2 {
                match alloc.view(g).vcpus[v] {
                    Slot::GrantedResume => assert_eq!(alloc.acquire(g, v), Acquired::Resume),
                    Slot::HandOff => {
                        assert_eq!(alloc.acquire(g, v), Acquired::HandOff);
                        alloc.release(g, v, Release::Preempted);
                    }
                    _ => {}
                }
            }
        }
        assert_eq!((alloc.view(idle).share, alloc.view(busy).share), (1, 1));
        // The idle guest yields its only processor: the busy one gets both.
        let v = (0..2)
            .find(|&v| matches!(alloc.view(idle).vcpus[v], Slot::Running(_)))
            .unwrap();
        alloc.release(idle, v, Release::Yielded);
        assert_eq!(alloc.view(idle).share, 0);
        assert_eq!(alloc.view(busy).share, 2);
        // An event for the idle guest: it wants a processor again.
        alloc.want_one(idle);
        assert_eq!((alloc.view(idle).wanted, alloc.view(idle).share), (1, 1));
    }

    #[test]
    fn stopped_guest_exits_its_threads() {
        let alloc = Allocator::new(1, Duration::from_millis(10));
        let g = alloc.add_guest(2);
        alloc.remove_guest(g);
        assert_eq!(alloc.acquire(g, 0), Acquired::Exit);
        assert_eq!(alloc.acquire(g, 1), Acquired::Exit);
    }
}
