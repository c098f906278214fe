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

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod decide;
mod guest_state;
mod place;
mod settle;
mod shares;
mod timed;
use guest_state::GuestState;
use shares::tiered_shares;
pub use shares::water_fill;
pub use timed::{SleeperProbe, Sleepers, TimerDue};

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
    pub fn holds_processor(&self) -> bool {
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
    /// Parked past the deadline given to [`Allocator::acquire_until`].
    WakeDue,
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
    /// When the change that settled the allocator was made, for [`Allocator::wait_settled`]: the
    /// waiter itself may run much later (woken onto a busy host CPU).
    settled_at: Option<Instant>,
    /// Yielded vCPUs of latency-critical guests and when they want a processor again
    /// ([`Allocator::yield_until`]).
    timed_wakes: Vec<timed::TimedWake>,
    /// Which host CPU each processor is, and the vCPU threads bound to them (`place.rs`).
    placement: place::Placement,
}

/// The processor allocator (see the module comment).
#[derive(Debug)]
pub struct Allocator {
    state: Mutex<State>,
    /// Signalled when a grant is picked up or a revoked processor comes back, for
    /// [`Allocator::wait_settled`].
    settling: Condvar,
    /// `State::timed_wakes` is not empty: a kicked vCPU thread looks at it only then.
    wakes_pending: AtomicBool,
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
    /// Timed wake-ups carried out by another guest's running vCPU thread.
    pub wakes_fired: u64,
    /// Timed wake-ups found redundant (their sleepers awake): moved to a later sleeper, dropped.
    pub wakes_moved: u64,
    pub wakes_dropped: u64,
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
                settled_at: None,
                timed_wakes: Vec::new(),
                placement: place::Placement::default(),
            }),
            wakes_pending: AtomicBool::new(false),
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
            latency_critical: false,
            wakes_fired: 0,
            wakes_moved: 0,
            wakes_dropped: 0,
            wake_first: None,
            started: vec![now; nr_vcpus],
            sleepers: None,
        });
        state.placement.add_guest(nr_vcpus);
        state.guests.len() - 1
    }

    /// Bind every processor to a host CPU of this process and a granted vCPU's thread to its
    /// processor's CPU (`place.rs`), if the budget covers every CPU this process may use; not
    /// for host-scheduled runs. Says whether it is on.
    pub fn place_on_host_cpus(&self) -> bool {
        let mut state = self.lock();
        let budget = state.budget;
        state.placement.enable(budget)
    }

    /// The calling thread runs `vcpu` of `guest` (its id is `tid`), until
    /// [`Allocator::unregister_thread`].
    pub fn register_thread(&self, guest: GuestId, vcpu: usize, tid: libc::pid_t) {
        self.lock().placement.register(guest, vcpu, tid);
    }

    /// The thread of `vcpu` of `guest` ends.
    pub fn unregister_thread(&self, guest: GuestId, vcpu: usize) {
        self.lock().placement.unregister(guest, vcpu);
    }

    /// vCPU threads moved to another host CPU so far (for `--stats`).
    pub fn rebinds(&self) -> u64 {
        self.lock().placement.rebinds
    }

    /// Times placement was widened for a granted thread that started late (for `--stats`).
    pub fn placement_widenings(&self) -> u64 {
        self.lock().placement.widenings
    }

    /// Mark `guest` latency-critical (served first) or not; takes effect at the next rebalance.
    pub fn set_latency_critical(&self, guest: GuestId, on: bool) {
        self.lock().guests[guest].latency_critical = on;
    }

    /// `guest`'s vCPU threads run at the host's idle priority (`place.rs`).
    pub fn set_host_idle_priority(&self, guest: GuestId, on: bool) {
        self.lock().placement.set_idle(guest, on);
    }

    /// How to read `guest`'s earliest sleeper: its timed wake-ups then follow it (`timed.rs`).
    pub fn watch_sleepers(&self, guest: GuestId, probe: SleeperProbe) {
        self.lock().guests[guest].sleepers = Some(probe);
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
        let (previous, kicks, _) = self.set_concurrency_granting(guest, n);
        (previous, kicks)
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
        self.acquire_until(guest, vcpu, None)
    }

    /// [`Allocator::acquire`], but a vCPU still parked at `deadline` returns
    /// [`Acquired::WakeDue`] (its guest yielded it until then: see [`Allocator::wake_for_timer`]).
    pub fn acquire_until(
        &self,
        guest: GuestId,
        vcpu: usize,
        deadline: Option<Instant>,
    ) -> Acquired {
        let mut state = self.lock();
        loop {
            let slot = &mut state.guests[guest].vcpus[vcpu];
            match *slot {
                Slot::Stopped => return Acquired::Exit,
                Slot::GrantedResume | Slot::Running(_) => {
                    let granted = *slot == Slot::GrantedResume;
                    let now = Instant::now();
                    *slot = Slot::Running(now);
                    if granted {
                        state.placement.started(guest, vcpu, now);
                    }
                    self.settle(&mut state);
                    return Acquired::Resume;
                }
                Slot::GrantedNew => {
                    let now = Instant::now();
                    *slot = Slot::Running(now);
                    state.guests[guest].started[vcpu] = now;
                    state.placement.started(guest, vcpu, now);
                    self.settle(&mut state);
                    return Acquired::NewActivation;
                }
                Slot::HandOff => {
                    // It gives the processor it briefly uses for the hand-off straight back.
                    *slot = Slot::Revoking;
                    return Acquired::HandOff;
                }
                Slot::Parked if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Acquired::WakeDue;
                }
                Slot::Revoking | Slot::Runnable(_) | Slot::Parked | Slot::Blocked => {
                    let parked = *slot == Slot::Parked;
                    let wake = Arc::clone(&state.guests[guest].wake[vcpu]);
                    state = match deadline {
                        Some(d) if parked => {
                            let left = d.saturating_duration_since(Instant::now());
                            wake.wait_timeout(state, left)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                        _ => wake.wait(state).unwrap_or_else(|e| e.into_inner()),
                    };
                }
            }
        }
    }

    /// Whether idle `vcpu` of `guest`, offering its processor back while the guest's block
    /// requests are in flight (`SHARED_FEATURE_YIELD_IO`), keeps it instead (the guest halts
    /// it until the completion): when no other guest wants more processors than it holds
    /// (nobody would use it), and for a latency-critical guest when no other vCPU of it holds
    /// one. A new activation per completion, ~2 per request, cost such a server 4x its median
    /// latency beside a batch guest; keeping every idle processor of it starved the batch
    /// guest (`cargo xtask bench latency`): one warm processor takes the completions.
    pub fn keeps_processor_for_io(&self, guest: GuestId, vcpu: usize) -> bool {
        let state = self.lock();
        let g = &state.guests[guest];
        (g.latency_critical && !g.others_hold(vcpu))
            || !state
                .guests
                .iter()
                .enumerate()
                .any(|(id, g)| id != guest && g.demand() > g.holding())
    }

    /// Whether a vCPU of `guest` other than `vcpu` holds a processor (it takes the guest's
    /// completions and timers while `vcpu` is given back).
    pub fn others_hold(&self, guest: GuestId, vcpu: usize) -> bool {
        self.lock().guests[guest].others_hold(vcpu)
    }

    /// Whether the allocator wants this vCPU's processor back.
    pub fn revoking(&self, guest: GuestId, vcpu: usize) -> bool {
        self.lock().guests[guest].vcpus[vcpu] == Slot::Revoking
    }

    /// `vcpu` gives its processor back; returns the vCPUs to kick.
    pub fn release(&self, guest: GuestId, vcpu: usize, why: Release) -> Vec<(GuestId, usize)> {
        self.release_locked(&mut self.lock(), guest, vcpu, why)
    }

    fn release_locked(
        &self,
        state: &mut State,
        guest: GuestId,
        vcpu: usize,
        why: Release,
    ) -> Vec<(GuestId, usize)> {
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
        let kicks = self.rebalance_locked(state, Instant::now());
        self.settle(state);
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

    /// A timer of `guest` is due and `vcpu` gave its processor back until then: the guest
    /// wants one more processor than it holds (up to its concurrency), and this vCPU is the one
    /// to start if it gets it. Other guests lose a processor to it at once if the shares say
    /// so (Shenango's grant on a due timer). Returns the vCPUs to kick.
    pub fn wake_for_timer(&self, guest: GuestId, vcpu: usize) -> Vec<(GuestId, usize)> {
        self.wake_for_timer_locked(&mut self.lock(), guest, vcpu)
    }

    fn wake_for_timer_locked(
        &self,
        state: &mut State,
        guest: GuestId,
        vcpu: usize,
    ) -> Vec<(GuestId, usize)> {
        let g = &mut state.guests[guest];
        if !g.activations || g.vcpus[vcpu] != Slot::Parked {
            return Vec::new();
        }
        g.wanted = g.wanted.max(g.holding() + 1).min(g.concurrency.max(1));
        g.wake_first = Some(vcpu);
        state.prefer_new = Some((guest, vcpu));
        let kicks = self.rebalance_locked(state, Instant::now());
        state.prefer_new = None;
        kicks
    }

    /// Recompute the shares and act on them; call every quantum. Returns the vCPUs to kick.
    pub fn rebalance(&self) -> Vec<(GuestId, usize)> {
        let mut state = self.lock();
        state.rotation = state.rotation.wrapping_add(1);
        let now = Instant::now();
        place::widen_if_slow(&mut state, now);
        place::share_cpus_in_lone_guests(&mut state);
        self.rebalance_locked(&mut state, now)
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
            wakes_fired: g.wakes_fired,
            wakes_moved: g.wakes_moved,
            wakes_dropped: g.wakes_dropped,
        }
    }

    fn rebalance_locked(&self, state: &mut State, now: Instant) -> Vec<(GuestId, usize)> {
        let kicks = decide::decide(state, now);
        // A revoke may have been withdrawn or nothing may be left to do: either settles.
        self.settle(state);
        kicks
    }
}

#[cfg(test)]
mod tests;
