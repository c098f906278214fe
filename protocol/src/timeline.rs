//! The guest runtime's timeline: which thread ran on which vCPU, and what the runtime did with
//! the contexts upcall records brought. The VMM merges it into its `--trace` file.
//!
//! When the VMM records a trace it sets [`crate::shared::SHARED_FEATURE_TIMELINE`] in
//! `SharedHeader::features`. A runtime that wants to take part then puts one [`TimelineRing`]
//! per vCPU, back to back, in its own memory (64-byte aligned, in RAM at or above the image
//! base) and registers them with `timeline_setup(gpa, nr_rings)`
//! ([`crate::hypercall::Hypercall::TimelineSetup`]); `nr_rings` is the guest's vCPU count.
//! Without the feature bit the call is a protocol violation, and a runtime that registers
//! nothing writes nothing: tracing off costs it one load and branch per event site.
//!
//! **Ring protocol** (single producer: the runtime code running on that vCPU; single consumer:
//! the VMM). The producer loads `tail` (acquire); if `head - tail == CAPACITY` the ring is full:
//! it adds one to `dropped` and goes on (never waits, never exits). Otherwise it writes
//! `events[head % CAPACITY]` with plain stores, then stores `head + 1` with release. The VMM
//! reads `events[tail..head]` after an acquire load of `head` and stores the new `tail` with
//! release. It drains when the vCPU is out of the guest anyway (it gave its processor back),
//! periodically, and at the guest's end. Everything it reads is untrusted: indices are taken
//! modulo the capacity, unknown kinds and timestamps outside the run are skipped.
//!
//! **Timestamps** are the guest's TSC (x86_64) or CNTVCT_EL0 (aarch64), which the VMM sets to
//! follow the host's counter, so they compare with the VMM's own events directly.

use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::wire::wire_enum;
use crate::CacheAligned;

/// Events in each vCPU's ring (a power of two).
pub const TIMELINE_RING_CAPACITY: usize = 4096;

wire_enum! {
    /// What a [`TimelineEvent`] says.
    pub enum TimelineKind: u32 {
        /// Thread `thread` starts running on this ring's vCPU.
        SwitchIn = 1 => "switch in",
        /// Thread `thread` stops running on this ring's vCPU; `arg` is a [`SwitchReason`].
        SwitchOut = 2 => "switch out",
        /// The runtime on this ring's vCPU handled an upcall record about vCPU `vcpu`:
        /// `arg` is [`record_arg`] (the record's kind and what was done with it), `thread`
        /// the thread whose context it carried (0: none, or a scheduler's).
        RecordHandled = 3 => "record handled",
        /// Bytes `vcpu..vcpu + 8` of thread `thread`'s name, in `arg` (little-endian, NUL
        /// padded). Sent before the thread first runs.
        ThreadName = 4 => "thread name",
    }
}

wire_enum! {
    /// Why a thread left its vCPU ([`TimelineKind::SwitchOut`]).
    pub enum SwitchReason: u64 {
        /// It yielded.
        Yield = 1 => "yield",
        /// Its time slice ended (or the scheduler had deferred work).
        Preempted = 2 => "preempted",
        /// It waits (a lock, a channel, I/O, a join, a sleep).
        Park = 3 => "park",
        /// It exited.
        Exit = 4 => "exit",
    }
}

wire_enum! {
    /// What the runtime did with the context a record carried ([`TimelineKind::RecordHandled`]).
    pub enum RecordAction: u64 {
        /// The thread went back on the run queue.
        Requeued = 1 => "requeued",
        /// The thread runs next on the handling vCPU (an UNBLOCKED one).
        RunNext = 2 => "run next",
        /// A lock holder: continued at once on the handling vCPU.
        Continued = 3 => "continued",
        /// A busy scheduler's context: adopted by the handling vCPU.
        Adopted = 4 => "adopted",
        /// An idle scheduler's context (or an activation entry's): dropped.
        Dropped = 5 => "dropped",
        /// The thread stays blocked in the VMM until its UNBLOCKED (a BLOCKED record).
        BlockedInVmm = 6 => "blocked in the VMM",
        /// Not handled yet (the activation's state was not filed): retried later.
        Later = 7 => "later",
    }
}

/// [`TimelineKind::RecordHandled`]'s `arg`: the record's `UpcallKind` in the low 32 bits, the
/// [`RecordAction`] above.
pub const fn record_arg(upcall_kind: u32, action: RecordAction) -> u64 {
    ((action as u64) << 32) | upcall_kind as u64
}

/// The record's `UpcallKind` and the action (raw) of a [`record_arg`].
pub const fn split_record_arg(arg: u64) -> (u32, u64) {
    (arg as u32, arg >> 32)
}

/// One event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    /// The guest's counter when it happened.
    pub tsc: u64,
    /// [`TimelineKind`] as u32.
    pub kind: u32,
    /// Kind-specific: the record's vCPU, or a name chunk's offset.
    pub vcpu: u32,
    /// The runtime's thread id (`Tcb::id`), 0 for none.
    pub thread: u64,
    /// Kind-specific.
    pub arg: u64,
}

/// One vCPU's ring.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct TimelineRing {
    /// Guest writes: producer index (free-running).
    pub head: CacheAligned<AtomicU32>,
    /// Guest writes: events dropped because the ring was full.
    pub dropped: CacheAligned<AtomicU64>,
    /// VMM writes: consumer index (free-running).
    pub tail: CacheAligned<AtomicU32>,
    /// Guest writes.
    pub events: [TimelineEvent; TIMELINE_RING_CAPACITY],
}

impl TimelineRing {
    pub const fn new() -> TimelineRing {
        TimelineRing {
            head: CacheAligned(AtomicU32::new(0)),
            dropped: CacheAligned(AtomicU64::new(0)),
            tail: CacheAligned(AtomicU32::new(0)),
            events: [TimelineEvent {
                tsc: 0,
                kind: 0,
                vcpu: 0,
                thread: 0,
                arg: 0,
            }; TIMELINE_RING_CAPACITY],
        }
    }
}

impl Default for TimelineRing {
    fn default() -> TimelineRing {
        TimelineRing::new()
    }
}

const _: () = assert!(TIMELINE_RING_CAPACITY.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout() {
        assert_eq!(size_of::<TimelineEvent>(), 32);
        assert_eq!(offset_of!(TimelineEvent, kind), 8);
        assert_eq!(offset_of!(TimelineEvent, vcpu), 12);
        assert_eq!(offset_of!(TimelineEvent, thread), 16);
        assert_eq!(offset_of!(TimelineEvent, arg), 24);
        assert_eq!(offset_of!(TimelineRing, head), 0);
        assert_eq!(offset_of!(TimelineRing, dropped), 64);
        assert_eq!(offset_of!(TimelineRing, tail), 128);
        assert_eq!(offset_of!(TimelineRing, events), 192);
        assert_eq!(size_of::<TimelineRing>(), 192 + 32 * TIMELINE_RING_CAPACITY);
        assert_eq!(align_of::<TimelineRing>(), 64);
    }

    #[test]
    fn values() {
        assert_eq!(
            (TimelineKind::SwitchIn.raw(), TimelineKind::ThreadName.raw()),
            (1, 4)
        );
        assert_eq!(
            (SwitchReason::Yield.raw(), SwitchReason::Exit.raw()),
            (1, 4)
        );
        let arg = record_arg(2, RecordAction::Requeued);
        assert_eq!(arg, (1 << 32) | 2);
        assert_eq!(split_record_arg(arg), (2, 1));
        assert_eq!(RecordAction::from_raw(7), Some(RecordAction::Later));
    }
}
