//! One guest's part of the allocator's state: its vCPUs' slots and what it asks for.

use std::sync::{Arc, Condvar};
use std::time::Instant;

#[cfg(doc)]
use super::{shares::tiered_shares, Allocator};
use super::{SleeperProbe, Slot};

#[derive(Debug)]
pub(super) struct GuestState {
    pub(super) vcpus: Vec<Slot>,
    /// Whether the guest takes upcalls (`sa_enable` done and activations not disabled).
    pub(super) activations: bool,
    /// Processors the guest says it can use (`sa_setconcurrency`, or a cap from `activm ctl`).
    pub(super) concurrency: usize,
    /// Processors an activation guest wants now: `concurrency`, less one for every processor it
    /// gave back idle (`sa_yield`) since it last asked (Anderson et al. 1992, section 4.1: "this processor
    /// is idle" lowers its demand until it asks again).
    pub(super) wanted: usize,
    /// The share computed by the last rebalance.
    pub(super) share: usize,
    pub(super) removed: bool,
    /// What each vCPU's thread waits on in [`Allocator::acquire`]: a grant wakes only the thread
    /// it concerns (with one condition variable for all, every parked vCPU of every guest woke,
    /// took the lock and went back to sleep at each grant).
    pub(super) wake: Vec<Arc<Condvar>>,
    /// Served before the others ([`tiered_shares`]).
    pub(super) latency_critical: bool,
    /// Timed wake-ups of this guest's yielded vCPUs carried out on another guest's running
    /// vCPU thread ([`Allocator::fire_due_wakes`]).
    pub(super) wakes_fired: u64,
    /// Timed wake-ups found redundant when due (their sleepers were awake): moved to the
    /// guest's next sleeper, or dropped (`timed.rs`, `follow_sleeper`).
    pub(super) wakes_moved: u64,
    pub(super) wakes_dropped: u64,
    /// A parked vCPU woken for its timer ([`Allocator::wake_for_timer`]): the next new
    /// activation of the guest starts there, however many rebalances it takes to free a
    /// processor. Another vCPU started instead would leave this one parked, and its own
    /// deadline would then ask for a second processor the guest does not need.
    pub(super) wake_first: Option<usize>,
    /// When each vCPU's current activation started (its scheduler has looked at the guest's
    /// timers since then): whether its timer or its yield covers another vCPU's timed wake-up
    /// (`timed.rs`).
    pub(super) started: Vec<Instant>,
    /// Reads the guest's earliest sleeper ([`Allocator::watch_sleepers`]).
    pub(super) sleepers: Option<SleeperProbe>,
}

impl GuestState {
    pub(super) fn holding(&self) -> usize {
        self.vcpus.iter().filter(|s| s.holds_processor()).count()
    }

    /// Whether a vCPU other than `vcpu` holds a processor.
    pub(super) fn others_hold(&self, vcpu: usize) -> bool {
        self.vcpus
            .iter()
            .enumerate()
            .any(|(v, s)| v != vcpu && s.holds_processor())
    }

    /// (vCPU, instant) of every vCPU whose slot `pick` maps to an instant.
    pub(super) fn since(&self, pick: impl Fn(&Slot) -> Option<Instant>) -> Vec<(usize, Instant)> {
        self.vcpus
            .iter()
            .enumerate()
            .filter_map(|(i, s)| pick(s).map(|t| (i, t)))
            .collect()
    }

    /// Processors this guest could use now.
    pub(super) fn demand(&self) -> usize {
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
