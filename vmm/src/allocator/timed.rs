//! Timed wake-ups of latency-critical guests, carried out by the running vCPU threads of the
//! guests that lose their processors for them (see [`Allocator::yield_until`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Allocator, GuestId, Release, Slot, State};

/// A yielded vCPU of a latency-critical guest and when it wants a processor again.
#[derive(Clone, Copy, Debug)]
pub struct TimedWake {
    pub at: Instant,
    pub guest: GuestId,
    pub vcpu: usize,
    /// When it yielded: the guest's scheduler looked at its timers just before.
    pub yielded: Instant,
    /// The deadline of the guest's earliest sleeper when it yielded (ns of the guest's clock),
    /// if the guest publishes it and the wake-up is for it: the sleeper this wake-up is for.
    pub sleeper: Option<u64>,
}

/// What a guest says of its sleepers and idle vCPUs (`SharedHeader`), read by a [`SleeperProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sleepers {
    /// The deadline of its earliest sleeping thread, in nanoseconds of its clock (`u64::MAX`:
    /// none sleeps).
    pub earliest_ns: u64,
    /// The vCPUs it marks idle, a bit each (`SharedHeader::idle_vcpus`).
    pub idle_vcpus: u64,
}

/// Reads a guest's [`Sleepers`]; `None` if the guest does not publish its earliest sleeper
/// (`SharedHeader::earliest_sleeper`). Called under the allocator's lock: it must be cheap.
#[derive(Clone)]
pub struct SleeperProbe(pub Arc<dyn Fn() -> Option<Sleepers> + Send + Sync>);

impl std::fmt::Debug for SleeperProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SleeperProbe")
    }
}

/// What a parked vCPU's own wake-up deadline comes to ([`Allocator::timer_due`]).
#[derive(Debug, PartialEq, Eq)]
pub enum TimerDue {
    /// It wants its processor back: the vCPUs to kick.
    Woken(Vec<(GuestId, usize)>),
    /// Its recorded wake-up is later than its thread's deadline: wait until then.
    Later(Instant),
    /// Its wake-up was carried out already, or a later yield's covers it.
    Gone,
}

/// A wake-up this close is carried out now: the kick timer may fire a hair before the instant
/// asked for, and a kick that finds nothing due would leave the wake-up to the parked thread.
pub const WAKE_SLACK: Duration = Duration::from_micros(10);

/// How much later a latency-critical guest's yielded vCPU wants its processor back when another
/// of its vCPUs still holds one: that one's scheduler wakes the sleepers itself (its idle loop
/// arms its timer before halting), and this wake-up is only the backstop for a busy one. Two
/// timed wake-ups for the same sleeper would each take a processor, and the two idle vCPUs
/// would yield again, both timed: the guest kept two processors of which it used one.
pub const WAKE_BACKSTOP: Duration = Duration::from_micros(250);

/// Who carries the timed wake-ups: the vCPUs of best-effort guests that hold a processor (their
/// threads run, or are about to), and the earliest wake-up to kick them at.
pub type Carriers = (Vec<(GuestId, usize)>, Instant);

impl Allocator {
    /// `vcpu` of `guest` was just given back (`sa_yield`) until `at`, when the guest's earliest
    /// timer is due. A latency-critical guest must get a processor then without waiting for
    /// the host to schedule the parked vCPU's thread (on a busy host, a sleeping thread's
    /// wake-up can wait milliseconds behind running vCPU threads). So the wake-up is
    /// recorded, and every best-effort vCPU holding a processor (one of them loses it for the
    /// wake-up) is returned with the earliest wake-up pending, for the caller to kick then
    /// ([`VcpuControl::kick_at`]): such a thread runs, so it acts at once
    /// ([`Allocator::fire_due_wakes`]). A vCPU granted a processor later arms itself
    /// ([`Allocator::next_timed_wake`]). `None`: nothing to arm (not latency-critical, or
    /// nobody to take from); the parked vCPU's own deadline does it
    /// ([`Allocator::acquire_until`]).
    ///
    /// [`VcpuControl::kick_at`]: crate::kick::VcpuControl::kick_at
    /// The wake-up is moved [`WAKE_BACKSTOP`] later if another vCPU of the guest holds a
    /// processor; `at` is updated to the time recorded.
    pub fn yield_until(&self, guest: GuestId, vcpu: usize, at: &mut Instant) -> Option<Carriers> {
        let mut state = self.lock();
        let carriers = yield_until_locked(&mut state, guest, vcpu, at, false);
        self.wakes_pending
            .store(!state.timed_wakes.is_empty(), Ordering::Release);
        carriers
    }

    /// `vcpu` of `guest` gives its processor back (`sa_yield`), until `at` if given: the
    /// release ([`Allocator::release`]) and the timed wake-up ([`Allocator::yield_until`])
    /// under one lock. The release may grant the processor to a vCPU whose thread the host
    /// runs on this very CPU (`place_vcpus`), and a host scheduler may then keep the yielding
    /// thread off the CPU for a whole tick (4 ms at HZ=250): a wake-up recorded after the
    /// release would wait that long unseen by its carriers. Recorded with it, the vCPU granted
    /// the processor finds it when it starts ([`Allocator::next_timed_wake`]). Returns the
    /// vCPUs to kick and the carriers to arm.
    ///
    /// `for_sleeper`: `at` is the wake-up the guest asked for its earliest sleeper, not moved
    /// earlier for a device completion; then the wake-up follows that sleeper
    /// ([`follow_sleeper`]).
    pub fn yield_processor(
        &self,
        guest: GuestId,
        vcpu: usize,
        at: Option<&mut Instant>,
        for_sleeper: bool,
    ) -> (Vec<(GuestId, usize)>, Option<Carriers>) {
        let mut state = self.lock();
        let kicks = self.release_locked(&mut state, guest, vcpu, Release::Yielded);
        if at.is_none()
            && state.guests[guest].latency_critical
            && !state.guests[guest].others_hold(vcpu)
        {
            // The guest's last processor, given back with no sleeper and no request in flight
            // when it looked: the others' wake-ups are all done. (A vCPU given back while
            // another runs asks for no wake-up: that one covers the guest's timers.)
            supersede(&mut state, guest, vcpu, None);
            self.wakes_pending
                .store(!state.timed_wakes.is_empty(), Ordering::Release);
        }
        let carriers = at.and_then(|at| {
            let carriers = yield_until_locked(&mut state, guest, vcpu, at, for_sleeper);
            self.wakes_pending
                .store(!state.timed_wakes.is_empty(), Ordering::Release);
            carriers
        });
        (kicks, carriers)
    }

    /// When a vCPU of `guest`, just granted a processor, should kick itself to carry out a
    /// timed wake-up (it holds a processor that wake-up may take): the earliest pending, if
    /// `guest` is best-effort.
    pub fn next_timed_wake(&self, guest: GuestId) -> Option<Instant> {
        if !self.wakes_pending.load(Ordering::Acquire) {
            return None;
        }
        let state = self.lock();
        if state.guests[guest].latency_critical {
            return None;
        }
        earliest(&state)
    }

    /// On a kicked vCPU thread: the yielded vCPUs whose wake-up time has come (within
    /// [`WAKE_SLACK`]) get their processor back ([`Allocator::wake_for_timer`]). Returns the
    /// vCPUs to kick (perhaps the caller's own); the caller re-arms for the wake-ups still to
    /// come with [`Allocator::next_timed_wake`].
    pub fn fire_due_wakes(&self) -> Vec<(GuestId, usize)> {
        if !self.wakes_pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // Drop the wake-ups of vCPUs that got a processor some other way.
        let guests = &state.guests;
        state
            .timed_wakes
            .retain(|w| guests[w.guest].vcpus[w.vcpu] == Slot::Parked);
        // Move the due ones whose sleepers are awake to the next sleeper (or drop them); each
        // change may remove others, so look again from the start (a handful of entries).
        for _ in 0..=2 * state.timed_wakes.len() {
            let changed = (0..state.timed_wakes.len()).any(|i| {
                state.timed_wakes[i].at <= now + WAKE_SLACK
                    && follow_sleeper(state, i) != Followed::Kept
            });
            if !changed {
                break;
            }
        }
        let (mut due, rest): (Vec<_>, Vec<_>) = state
            .timed_wakes
            .drain(..)
            .partition(|w| w.at <= now + WAKE_SLACK);
        state.timed_wakes = rest;
        due.sort_by_key(|w| w.at);
        let mut kicks = Vec::new();
        for w in due {
            if state.guests[w.guest].vcpus[w.vcpu] != Slot::Parked {
                continue;
            }
            state.guests[w.guest].wakes_fired += 1;
            kicks.extend(self.wake_for_timer_locked(state, w.guest, w.vcpu));
        }
        self.wakes_pending
            .store(!state.timed_wakes.is_empty(), Ordering::Release);
        kicks
    }

    /// On the thread of parked `vcpu` of `guest`: the deadline it yielded until has come. A
    /// best-effort guest's vCPU wants its processor back ([`Allocator::wake_for_timer`]); a
    /// latency-critical guest's follows its recorded wake-up, which may have been carried out
    /// already (by a carrier) or superseded by a later yield ([`supersede`]).
    pub fn timer_due(&self, guest: GuestId, vcpu: usize) -> TimerDue {
        let mut state = self.lock();
        if !state.guests[guest].latency_critical {
            return TimerDue::Woken(self.wake_for_timer_locked(&mut state, guest, vcpu));
        }
        let now = Instant::now();
        let Some(i) = state
            .timed_wakes
            .iter()
            .position(|w| (w.guest, w.vcpu) == (guest, vcpu))
        else {
            return TimerDue::Gone;
        };
        if state.timed_wakes[i].at <= now + WAKE_SLACK
            && follow_sleeper(&mut state, i) == Followed::Dropped
        {
            self.wakes_pending
                .store(!state.timed_wakes.is_empty(), Ordering::Release);
            return TimerDue::Gone;
        }
        // (Moved by `follow_sleeper`: its record may now be another's.)
        let Some(i) = state
            .timed_wakes
            .iter()
            .position(|w| (w.guest, w.vcpu) == (guest, vcpu))
        else {
            self.wakes_pending
                .store(!state.timed_wakes.is_empty(), Ordering::Release);
            return TimerDue::Gone;
        };
        let w = state.timed_wakes[i];
        let due = if w.at > now + WAKE_SLACK {
            TimerDue::Later(w.at)
        } else if state.guests[guest].vcpus[vcpu] != Slot::Parked {
            state.timed_wakes.remove(i);
            TimerDue::Gone
        } else {
            state.timed_wakes.remove(i);
            TimerDue::Woken(self.wake_for_timer_locked(&mut state, guest, vcpu))
        };
        self.wakes_pending
            .store(!state.timed_wakes.is_empty(), Ordering::Release);
        due
    }
}

/// `vcpu` of `guest` yielded until `at` (`None`: untimed): the wake-ups of its guest's other
/// vCPUs that yielded before its activation started are covered by it (its scheduler looked
/// at the guest's timers after them: each of their sleepers still asleep is on `at`), unless
/// `at` was moved later by the backstop past theirs.
fn supersede(state: &mut State, guest: GuestId, vcpu: usize, at: Option<(Instant, bool)>) {
    let started = state.guests[guest].started[vcpu];
    state.timed_wakes.retain(|w| {
        w.guest != guest
            || w.vcpu == vcpu
            || w.yielded >= started
            || at.is_some_and(|(at, backstopped)| backstopped && at > w.at)
    });
}

/// [`Allocator::yield_until`] with the lock held; the caller sets `wakes_pending`.
fn yield_until_locked(
    state: &mut State,
    guest: GuestId,
    vcpu: usize,
    at: &mut Instant,
    for_sleeper: bool,
) -> Option<Carriers> {
    let g = &state.guests[guest];
    if !g.latency_critical || !g.activations || g.vcpus[vcpu] != Slot::Parked {
        return None;
    }
    let backstopped = g
        .vcpus
        .iter()
        .any(|s| s.holds_processor() && *s != Slot::Revoking);
    if backstopped {
        *at += WAKE_BACKSTOP;
    }
    let at = *at;
    state
        .timed_wakes
        .retain(|w| (w.guest, w.vcpu) != (guest, vcpu));
    supersede(state, guest, vcpu, Some((at, backstopped)));
    let sleeper = for_sleeper
        .then(|| sleepers(state, guest))
        .flatten()
        .map(|s| s.earliest_ns)
        .filter(|&ns| ns != u64::MAX);
    state.timed_wakes.push(TimedWake {
        at,
        guest,
        vcpu,
        yielded: Instant::now(),
        sleeper,
    });
    one_per_sleeper(state, state.timed_wakes.len() - 1);
    let carriers = carriers(state);
    let first = earliest(state)?;
    (!carriers.is_empty()).then_some((carriers, first))
}

/// The earliest pending timed wake-up.
fn earliest(state: &State) -> Option<Instant> {
    state.timed_wakes.iter().map(|w| w.at).min()
}

/// The vCPUs of best-effort guests that hold a processor.
fn carriers(state: &State) -> Vec<(GuestId, usize)> {
    state
        .guests
        .iter()
        .enumerate()
        .filter(|(_, g)| !g.latency_critical)
        .flat_map(|(id, g)| {
            g.vcpus
                .iter()
                .enumerate()
                .filter(|(_, s)| s.holds_processor() && **s != Slot::Revoking)
                .map(move |(v, _)| (id, v))
        })
        .collect()
}

/// The deadline of `guest`'s earliest sleeper, if it publishes it.
fn sleepers(state: &State, guest: GuestId) -> Option<Sleepers> {
    state.guests[guest].sleepers.as_ref().and_then(|p| (p.0)())
}

/// What [`follow_sleeper`] did to a wake-up.
#[derive(Debug, PartialEq, Eq)]
enum Followed {
    /// Left as it was (its sleeper still sleeps, or nothing is known).
    Kept,
    /// Moved to the guest's next sleeper.
    Moved,
    /// Removed: no sleeper is left, or another wake-up is for the same one.
    Dropped,
}

/// Timed wake-up `i` comes due: if the guest's earliest sleeper is now later than the one it
/// was for, every sleeper it was for was woken (by a vCPU of the guest that held a processor:
/// only a running scheduler takes sleepers off the guest's one list), and if no other vCPU of
/// the guest is busy now, each woken one runs or has run, and the processor would only idle.
/// The wake-up then follows the guest's earliest sleeper: moved later by as much (keeping its
/// lead and backstop), dropped if none sleeps. A sleeper still asleep keeps it
/// as it is, so no wake-up a sleeper needs is ever lost.
fn follow_sleeper(state: &mut State, i: usize) -> Followed {
    let w = state.timed_wakes[i];
    let Some(was) = w.sleeper else {
        return Followed::Kept;
    };
    let Some(seen) = sleepers(state, w.guest) else {
        return Followed::Kept;
    };
    let now = seen.earliest_ns;
    if now <= was {
        return Followed::Kept;
    }
    // A sleeper woken on a vCPU that is busy may wait there behind the running thread: the
    // wake-up still brings a processor to run it beside (as it did before the guest published
    // its sleepers). Only with every other vCPU of the guest idle or without a processor is
    // the woken sleeper surely running or run.
    let g = &state.guests[w.guest];
    let busy = g.vcpus.iter().enumerate().any(|(v, s)| {
        v != w.vcpu && s.holds_processor() && (v >= 64 || seen.idle_vcpus & (1 << v) == 0)
    });
    if busy {
        return Followed::Kept;
    }
    // (A deadline out of `Instant`'s range is none: the guest's value is untrusted.)
    let Some(at) = (now != u64::MAX)
        .then(|| w.at.checked_add(Duration::from_nanos(now - was)))
        .flatten()
    else {
        state.timed_wakes.remove(i);
        state.guests[w.guest].wakes_dropped += 1;
        return Followed::Dropped;
    };
    let w = &mut state.timed_wakes[i];
    w.at = at;
    w.sleeper = Some(now);
    let guest = w.guest;
    if one_per_sleeper(state, i) {
        Followed::Dropped
    } else {
        state.guests[guest].wakes_moved += 1;
        Followed::Moved
    }
}

/// Of wake-up `i` and the guest's other wake-ups for the same sleeper, only the earliest
/// stays: one new activation wakes every sleeper due then (the guest's timers are one list),
/// and each other one would take a processor to idle on. `true` if `i` was the one removed.
fn one_per_sleeper(state: &mut State, i: usize) -> bool {
    let w = state.timed_wakes[i];
    let Some(sleeper) = w.sleeper else {
        return false;
    };
    let same = |o: &TimedWake| o.guest == w.guest && o.sleeper == Some(sleeper);
    let Some(keep) = state
        .timed_wakes
        .iter()
        .enumerate()
        .filter(|(_, o)| same(o))
        .min_by_key(|(j, o)| (o.at, *j != i))
        .map(|(j, _)| j)
    else {
        return false;
    };
    let before = state.timed_wakes.len();
    let mut j = 0;
    state.timed_wakes.retain(|o| {
        let drop = j != keep && same(o);
        j += 1;
        !drop
    });
    state.guests[w.guest].wakes_dropped += (before - state.timed_wakes.len()) as u64;
    keep != i
}
