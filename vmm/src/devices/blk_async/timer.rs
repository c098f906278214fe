//! The disk's timer thread: the poster of last resort of delayed completions, and one of the
//! lookers at the submission ring.
//!
//! On this host every wake-up of a VMM thread where a vCPU runs costs that vCPU an exit and a
//! re-entry besides the thread's own work, so completions due go out first from exits the
//! guest's vCPU threads make anyway (a `blk_submit`, a `halt`, a `blk_doorbell`:
//! `Shared::post_at_exit`) and from a halted vCPU polling for them (`after_kick`); the timer
//! thread posts what nobody else did, and at each wake-up takes the submission ring
//! (`submit_ring.rs`: while it has a deadline the ring says `LOOKING` and the guest rings no
//! doorbell).
//!
//! **Its deadline moves without waking it.** It sleeps on a timerfd, and whoever changes what
//! it waits for (under the queue's lock) re-arms the timerfd: earlier when something new is due
//! sooner, *later* when an exit posted what it would have woken for (re-arming resets the
//! expiry count, so the sleeper never sees the old deadline). A condition variable could only
//! be woken early, never told to sleep longer.
//!
//! **How late it may post.** Due completions wait for it:
//! - [`POLLER_GRACE`] when a halted vCPU polls for them (its kick is due at the same time);
//! - the guest's `nudge_us` ([`BUSY_GRACE`] if it set none) when it marks no vCPU idle
//!   (`SharedHeader::idle_vcpus` is 0; an oblivious guest has none halted) and a vCPU of it
//!   holds a processor: a busy vCPU finds completions only when it schedules, and its next
//!   exit posts them; the guest asked for an interrupt only after `nudge_us` anyway. A vCPU
//!   that goes idle meanwhile halts (and posts what is due, or polls) or yields (and is woken
//!   at the earliest due time, `vcpu/handoff.rs`), so nothing waits on the grace but busy
//!   vCPUs. One wake-up posts everything due by then;
//! - nothing otherwise (an idle vCPU is interrupted for them at once).
//!
//! UNBLOCKED records and the nudge are never deferred beyond the poller's grace.

use std::cmp::Reverse;
use std::mem::offset_of;
use std::sync::atomic::{fence, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

use protocol::blk::BlkRing;
use protocol::shared::SharedHeader;

use super::wake::{wake_for_completions, wake_one_idle, wake_one_running};
use super::{
    nudge_due, post_due, read_u32, ring_field, unblock, Shared, State, IDLE_CHECK, POLLER_GRACE,
};
use crate::guest::Guest;
use crate::vm::Outcome;

/// How long the timer thread leaves a due completion to busy vCPUs, whose next exit posts it,
/// when the guest set no `nudge_us`.
pub const BUSY_GRACE: Duration = Duration::from_micros(500);

/// Whether a guest's vCPUs are all busy: none idle, and one holds a processor (`runs`: the
/// caller is one, in an exit). An activation guest marks its idle vCPUs before they halt; an
/// oblivious guest does not, so any vCPU that may be halted counts as idle there. (Call it
/// without the queue's lock: it takes the guest's and the allocator's.)
pub(super) fn busy(guest: &Guest, runs: bool) -> bool {
    let idle = if guest.acts.enabled() {
        guest
            .ram
            .read_u64(guest.plan.shared_area.start + offset_of!(SharedHeader, idle_vcpus) as u64)
            .unwrap_or(1)
            != 0
    } else {
        guest
            .vcpus
            .iter()
            .any(|v| v.maybe_halted.load(Ordering::Relaxed))
    };
    !idle
        && (runs
            || guest
                .procs
                .alloc
                .view(guest.id)
                .vcpus
                .iter()
                .any(|s| s.holds_processor()))
}

/// How long due completions may wait for busy vCPUs: the guest's `nudge_us` (the time it lets
/// a completion wait unconsumed before it wants a busy vCPU interrupted), [`BUSY_GRACE`] if
/// it set none.
pub(super) fn busy_grace(state: &State, guest: &Guest) -> Duration {
    let nudge_us = state.ring.map_or(0, |ring| {
        read_u32(guest, ring_field(ring, offset_of!(BlkRing, nudge_us))).unwrap_or(0)
    });
    match nudge_us {
        0 => BUSY_GRACE,
        us => Duration::from_micros(u64::from(us.min(1_000_000))),
    }
}

/// When the timer thread must wake for `state` (`None`: nothing to do).
fn deadline(state: &State, guest: &Guest, busy: bool) -> Option<Instant> {
    let poller = state.poller.map(|_| POLLER_GRACE);
    let grace = poller
        .or(busy.then(|| busy_grace(state, guest)))
        .unwrap_or(Duration::ZERO);
    let ring = state
        .delayed
        .peek()
        .map(|&Reverse((due, _, _))| due + grace);
    let unblock = unblock::earliest(state).map(|due| due + poller.unwrap_or(Duration::ZERO));
    let nudge = state.nudge.map(|(at, _)| at);
    [ring, unblock, nudge].into_iter().flatten().min()
}

impl Shared {
    /// Re-arm the timer thread for what `state` needs now (the caller holds the lock and
    /// changed it; `busy`: [`busy`], taken before the lock): earlier, or later to spare it a
    /// wake-up for what was done meanwhile.
    pub(super) fn retime(&self, state: &mut State, guest: &Guest, busy: bool) {
        if !state.timer_asleep {
            return; // It computes its deadline itself before it sleeps.
        }
        let want = deadline(state, guest, busy);
        if want == state.timer_wakes_at {
            return;
        }
        if let Some(timer) = self.timer.get() {
            timer.arm(want.unwrap_or_else(|| Instant::now() + IDLE_CHECK));
            state.timer_wakes_at = want;
        }
        if self.announce(state, guest, want) {
            self.ring_doorbell();
        }
    }

    /// Wake the timer thread now (the queue ends).
    pub(super) fn wake_timer_now(&self) {
        if let Some(timer) = self.timer.get() {
            timer.arm(Instant::now());
        }
    }
}

/// The body of the timer thread: post delayed completions and UNBLOCKED records nobody else
/// did by their deadline, and nudge a busy guest that leaves completions unconsumed.
pub(super) fn timer_thread(shared: &Shared, weak: &Weak<Guest>) {
    let Some(timer) = shared.timer.get() else {
        shared.lock().workers -= 1;
        return;
    };
    let mut woke = false;
    loop {
        let guest = weak.upgrade();
        let mut state = shared.lock();
        state.timer_asleep = false;
        let Some(guest) = guest.filter(|_| !state.closed) else {
            state.workers -= 1;
            return;
        };
        drop(state);
        if std::mem::take(&mut woke) {
            if let Some(disk) = &guest.disk {
                disk.stats.timer_wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        let busy = busy(&guest, false);
        let mut state = shared.lock();
        let now = Instant::now();
        let due = deadline(&state, &guest, busy);
        if state.closed {
            continue;
        }
        if due.is_none_or(|at| now < at) {
            state.timer_wakes_at = due;
            state.timer_asleep = true;
            timer.arm(due.unwrap_or(now + IDLE_CHECK));
            if shared.announce(&mut state, &guest, due) {
                shared.ring_doorbell();
            }
            drop(state);
            // The guest's `Arc` is not held while asleep: its end closes this queue.
            drop(guest);
            timer.wait();
            woke = true;
            continue;
        }
        // What the guest submitted through its ring meanwhile (this wake-up is when the VMM
        // said it would look).
        drop(state);
        if let Err(why) = shared.look(&guest, false) {
            guest.finish(Outcome::fault(0, why));
        }
        let mut state = shared.lock();
        let now = Instant::now();
        let unblocks = unblock::take_due(&mut state, now);
        let posted = post_due(&mut state, &guest, now, true);
        if let Some(disk) = &guest.disk {
            disk.stats
                .posted_by_timer
                .fetch_add(posted as u64, Ordering::Relaxed);
        }
        let posted = posted > 0;
        if (posted || !unblocks.is_empty()) && state.poller.is_some() {
            // The poller's grace ran out (its vCPU lost its processor, or its kick came late):
            // stop waiting for it.
            state.poller = None;
        }
        let nudge_now =
            state.nudge.is_some_and(|(at, _)| at <= now) && nudge_due(&mut state, &guest, now);
        drop(state);
        unblock::deliver(&guest, unblocks);
        if nudge_now {
            fence(Ordering::SeqCst);
            if !wake_one_idle(&guest) {
                wake_one_running(&guest);
            }
        } else if posted {
            fence(Ordering::SeqCst);
            wake_for_completions(&guest);
        }
    }
}
