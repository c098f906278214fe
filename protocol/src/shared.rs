//! The activation shared area: the VMM's and the guest's view of the guest's processors.
//!
//! ```text
//! shared_area ─► SharedHeader                  (one page)
//!                VcpuArea for vCPU 0           (VCPU_AREA_SIZE bytes each)
//!                VcpuArea for vCPU 1
//!                ...
//! ```
//!
//! Each field has exactly one writer, named in its comment, and fields of different writers sit
//! on different cache lines. Ordering rules (both sides use acquire/release atomics):
//!
//! * **Upcall queue** (single producer: the VMM; single consumer: the guest on that vCPU). The VMM
//!   writes a whole [`UpcallRecordOf`] at `records[head % CAP]`, then stores `head + 1` with
//!   release. The guest loads `head` with acquire, reads records `tail..head` in order, then
//!   stores the new `tail` with release. The VMM loads `tail` with acquire before reusing a slot;
//!   a queue that stays full is a guest that does not consume its upcalls, and the VMM stops it.
//! * **Upcall stack pool** (producer: the guest; consumer: the VMM): the guest writes
//!   `stacks[prod % POOL]` then stores `prod + 1` with release; the VMM takes `stacks[cons % POOL]`
//!   after an acquire load of `prod` and stores `cons + 1` with release.
//! * **Sequence numbers** are per guest, start at 1, and increase by one per record across all of
//!   the guest's queues, so the guest can merge queues and detect a gap.
//! * Everything the VMM reads from this area is untrusted: indices are taken modulo the capacity
//!   and checked against each other, addresses are checked against guest memory.

use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::wire::wire_enum;
use crate::{CacheAligned, MAX_VCPUS};

/// `SharedHeader::magic`: "ACTIVMSA".
pub const SHARED_MAGIC: u64 = u64::from_le_bytes(*b"ACTIVMSA");
/// Records in each vCPU's upcall queue (a power of two).
pub const UPCALL_QUEUE_CAPACITY: usize = 16;
/// Entries in the upcall stack pool (a power of two).
pub const STACK_POOL_CAPACITY: usize = 64;
/// Size of the shared header.
pub const SHARED_HEADER_SIZE: usize = 4096;
/// Size of one vCPU area.
pub const VCPU_AREA_SIZE: usize = 16384;

/// Total size of the shared area for `nr_vcpus` vCPUs.
pub const fn shared_area_size(nr_vcpus: usize) -> usize {
    SHARED_HEADER_SIZE + nr_vcpus * VCPU_AREA_SIZE
}

/// Offset of vCPU `index`'s area from the start of the shared area.
pub const fn vcpu_area_offset(index: usize) -> usize {
    SHARED_HEADER_SIZE + index * VCPU_AREA_SIZE
}

wire_enum! {
    /// What a vCPU is doing, as the VMM last recorded it (`VcpuArea::state`).
    pub enum VcpuRunState: u32 {
        /// Not running and not owed to the guest (never started, yielded, or removed).
        Stopped = 0 => "stopped",
        /// Running guest code on a physical CPU.
        Running = 1 => "running",
        /// Taken away by the VMM; its context was (or will be) handed over in a PREEMPTED record.
        Preempted = 2 => "preempted",
        /// Blocked in the VMM on emulated I/O; an UNBLOCKED record follows.
        Blocked = 3 => "blocked",
    }
}

wire_enum! {
    /// The kind of an upcall record (Williams 2002, section 4.1; `docs/references.md`).
    pub enum UpcallKind: u32 {
        /// A processor was granted: this activation is new and may run threads.
        NewProc = 1 => "NEWPROC",
        /// Activation `activation` (on vCPU `vcpu`) was preempted; its context is in the record.
        Preempted = 2 => "PREEMPTED",
        /// Activation `activation` blocked in the VMM; no context (it stays with the VMM).
        Blocked = 3 => "BLOCKED",
        /// Activation `activation` unblocked; its context is in the record.
        Unblocked = 4 => "UNBLOCKED",
        /// A host signal arrived: `arg` is the signal number.
        Signal = 5 => "SIGNAL",
        /// The guest asked (sa_preempt) to interrupt this vCPU; `arg` is the requester's vCPU.
        User = 6 => "USER",
    }
}

impl UpcallKind {
    /// Records of this kind carry a saved user context.
    pub const fn carries_context(self) -> bool {
        matches!(self, UpcallKind::Preempted | UpcallKind::Unblocked)
    }
}

/// `UpcallRecordOf::flags`: `context` is valid.
pub const RECORD_HAS_CONTEXT: u32 = 1 << 0;
/// `UpcallRecordOf::flags`: the context was taken at CPL0 or with interrupts off and was run
/// forward by the VMM to the first CPL3 instruction with interrupts on.
pub const RECORD_CONTEXT_ADVANCED: u32 = 1 << 1;

/// One upcall event. `C` is the architecture's user context
/// ([`crate::arch::x86_64::UserContext`] or [`crate::arch::aarch64::UserContext`]).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct UpcallRecordOf<C> {
    /// Per-guest sequence number, from 1, without gaps.
    pub seq: u64,
    /// [`UpcallKind`] as u32.
    pub kind: u32,
    /// `RECORD_*` flags.
    pub flags: u32,
    /// The activation the event is about.
    pub activation: u32,
    /// The vCPU that activation was running on.
    pub vcpu: u32,
    /// The activation that delivers the event (the one now running the upcall).
    pub delivered_to: u32,
    pub _pad: u32,
    /// Kind-specific argument (signal number, requester vCPU).
    pub arg: u64,
    /// Host TSC when the event happened (guest and host TSC agree): upcall latency.
    pub tsc: u64,
    pub _reserved: [u64; 2],
    /// The saved user context, when `flags & RECORD_HAS_CONTEXT`.
    pub context: C,
}

/// Per-vCPU part of the shared area.
#[repr(C, align(4096))]
#[derive(Debug)]
pub struct VcpuAreaOf<C> {
    /// VMM writes: [`VcpuRunState`] as u32.
    pub state: CacheAligned<AtomicU32>,
    /// VMM writes: the id of the activation currently on this vCPU (0 = none).
    pub activation: CacheAligned<AtomicU32>,
    /// VMM writes: non-zero when the VMM wants this vCPU back and is honouring
    /// `defer_preemption`; the guest calls `sa_yield` when it leaves its critical section.
    pub preempt_pending: CacheAligned<AtomicU32>,
    /// Guest writes: non-zero asks the VMM to defer a preemption briefly (bounded by the VMM).
    pub defer_preemption: CacheAligned<AtomicU32>,
    /// VMM writes: upcall queue producer index (free-running).
    pub queue_head: CacheAligned<AtomicU32>,
    /// Guest writes: upcall queue consumer index (free-running).
    pub queue_tail: CacheAligned<AtomicU32>,
    pub _reserved: [CacheAligned<u64>; 2],
    /// The upcall queue.
    pub records: [UpcallRecordOf<C>; UPCALL_QUEUE_CAPACITY],
}

/// [`SharedHeader::features`]: `sa_yield(wake_ns)` with a non-zero `wake_ns` gives the
/// processor back *for that long*: the VMM starts a new activation of the guest (preempting
/// another guest if it must) `wake_ns` nanoseconds after the call at the latest, so a guest
/// may give back its last processor while threads sleep. Without the bit the argument is
/// ignored.
pub const SHARED_FEATURE_YIELD_WAKE: u32 = 1 << 0;
/// [`SharedHeader::features`]: the VMM records a trace and merges the runtime's timeline into
/// it: the runtime may register its rings with `timeline_setup` ([`crate::timeline`]).
pub const SHARED_FEATURE_TIMELINE: u32 = 1 << 1;

/// [`SharedHeader::features`]: `sa_yield` may give the processor back while asynchronous block
/// requests are in flight, even the guest's last one: when a completion is due the VMM starts
/// a new activation of the guest (preempting another guest if the shares say so), with the
/// completion already in the ring. When no other guest wants the processor, the VMM declines
/// such a yield: `sa_yield` returns [`crate::hypercall::SA_YIELD_DECLINED`] at once, and the
/// vCPU should rather halt (cheaper than a new activation) for a while.
pub const SHARED_FEATURE_YIELD_IO: u32 = 1 << 2;

/// [`SharedHeader::features`]: a 4-byte store of [`crate::net::NET_DOORBELL_RING`] to the `net`
/// hypercall's slot ([`crate::net::net_doorbell_address`]) is `tx_flush_all` without an exit
/// to the VMM (an ioeventfd: the VMM's net thread sends what the transmit rings hold), for a
/// guest with sockets. Otherwise such a store is a protocol violation.
pub const SHARED_FEATURE_NET_DOORBELL: u32 = 1 << 3;

/// [`SharedHeader::features`]: as [`SHARED_FEATURE_YIELD_IO`] for socket waits: `sa_yield` may
/// give the processor back while socket waits are armed, even the guest's last one; when the
/// net thread publishes reports and no vCPU of the guest holds a processor, the VMM starts a
/// new activation of the guest (preempting another guest if the shares say so), the reports
/// already in the ring. When no other guest wants the processor the VMM declines such a yield
/// ([`crate::hypercall::SA_YIELD_DECLINED`]).
pub const SHARED_FEATURE_YIELD_NET: u32 = 1 << 4;

/// The first page of the shared area.
#[repr(C, align(4096))]
#[derive(Debug)]
pub struct SharedHeader {
    /// VMM writes once: [`SHARED_MAGIC`].
    pub magic: u64,
    /// VMM writes once: [`crate::ABI_VERSION`].
    pub abi_version: u32,
    /// VMM writes once: number of vCPU areas that follow.
    pub nr_vcpus: u32,
    /// VMM writes once: [`VCPU_AREA_SIZE`].
    pub vcpu_area_size: u32,
    /// VMM writes once: [`UPCALL_QUEUE_CAPACITY`].
    pub queue_capacity: u32,
    /// VMM writes once: what this VMM supports beyond the version, `SHARED_FEATURE_*` bits
    /// (0 from a VMM that predates the field: it was padding).
    pub features: u32,
    pub _pad0: [u8; 4],
    /// Guest writes once: the address of its runtime's [`crate::diag::RuntimeDiag`], for the
    /// VMM's hang report (0: none).
    pub runtime_diag: AtomicU64,
    pub _pad1: [u8; 24],
    /// Guest writes: how many vCPUs the guest can use (mirrors `sa_setconcurrency`).
    pub requested_concurrency: CacheAligned<AtomicU32>,
    /// Guest writes: bit i set = vCPU i is idle (spinning or halted with nothing to run).
    pub idle_vcpus: CacheAligned<AtomicU64>,
    /// VMM writes: how many vCPUs the allocator grants the guest right now.
    pub granted_vcpus: CacheAligned<AtomicU32>,
    /// Guest writes: upcall stack pool producer index (free-running).
    pub stack_prod: CacheAligned<AtomicU32>,
    /// VMM writes: upcall stack pool consumer index (free-running).
    pub stack_cons: CacheAligned<AtomicU32>,
    /// Guest writes: stack tops (16-byte aligned guest addresses) for NEWPROC upcalls.
    pub stacks: [u64; STACK_POOL_CAPACITY],
    /// Guest writes: the TSC deadline of its earliest sleeping thread, whenever it changes
    /// (`u64::MAX`: none sleeps). 0, as a guest that predates the field leaves it (the rest of
    /// the page): not published. The VMM reads it when a timed wake-up of a latency-critical
    /// guest comes due: a later deadline means the sleepers the yield was for are awake.
    pub earliest_sleeper: CacheAligned<AtomicU64>,
}

/// The shared area as seen by code built for this architecture.
pub type UpcallRecord = UpcallRecordOf<crate::arch::current::UserContext>;
pub type VcpuArea = VcpuAreaOf<crate::arch::current::UserContext>;

const _: () = assert!(MAX_VCPUS <= 64, "idle_vcpus is a 64-bit mask");
const _: () = assert!(UPCALL_QUEUE_CAPACITY.is_power_of_two());
const _: () = assert!(STACK_POOL_CAPACITY.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{aarch64, x86_64};
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn record_layout() {
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, seq), 0);
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, kind), 8);
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, flags), 12);
        assert_eq!(
            offset_of!(UpcallRecordOf<x86_64::UserContext>, activation),
            16
        );
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, vcpu), 20);
        assert_eq!(
            offset_of!(UpcallRecordOf<x86_64::UserContext>, delivered_to),
            24
        );
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, arg), 32);
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, tsc), 40);
        assert_eq!(offset_of!(UpcallRecordOf<x86_64::UserContext>, context), 64);
        assert_eq!(size_of::<UpcallRecordOf<x86_64::UserContext>>(), 64 + 704);
        assert_eq!(
            offset_of!(UpcallRecordOf<aarch64::UserContext>, context),
            64
        );
        assert_eq!(size_of::<UpcallRecordOf<aarch64::UserContext>>(), 64 + 832);
    }

    #[test]
    fn vcpu_area_layout() {
        type X = VcpuAreaOf<x86_64::UserContext>;
        assert_eq!(offset_of!(X, state), 0);
        assert_eq!(offset_of!(X, activation), 64);
        assert_eq!(offset_of!(X, preempt_pending), 128);
        assert_eq!(offset_of!(X, defer_preemption), 192);
        assert_eq!(offset_of!(X, queue_head), 256);
        assert_eq!(offset_of!(X, queue_tail), 320);
        assert_eq!(offset_of!(X, records), 512);
        assert!(size_of::<X>() <= VCPU_AREA_SIZE);
        assert!(size_of::<VcpuAreaOf<aarch64::UserContext>>() <= VCPU_AREA_SIZE);
        assert_eq!(align_of::<X>(), 4096);
    }

    #[test]
    fn header_layout() {
        assert_eq!(offset_of!(SharedHeader, abi_version), 8);
        assert_eq!(offset_of!(SharedHeader, nr_vcpus), 12);
        assert_eq!(offset_of!(SharedHeader, features), 24);
        assert_eq!(offset_of!(SharedHeader, runtime_diag), 32);
        assert_eq!(offset_of!(SharedHeader, requested_concurrency), 64);
        assert_eq!(offset_of!(SharedHeader, idle_vcpus), 128);
        assert_eq!(offset_of!(SharedHeader, granted_vcpus), 192);
        assert_eq!(offset_of!(SharedHeader, stack_prod), 256);
        assert_eq!(offset_of!(SharedHeader, stack_cons), 320);
        assert_eq!(offset_of!(SharedHeader, stacks), 384);
        assert_eq!(offset_of!(SharedHeader, earliest_sleeper), 896);
        assert!(size_of::<SharedHeader>() <= SHARED_HEADER_SIZE);
        assert_eq!(shared_area_size(2), 4096 + 2 * 16384);
        assert_eq!(vcpu_area_offset(1), 4096 + 16384);
    }

    #[test]
    fn kinds_round_trip() {
        for raw in 0..10 {
            if let Some(kind) = UpcallKind::from_raw(raw) {
                assert_eq!(kind as u32, raw);
            }
            if let Some(state) = VcpuRunState::from_raw(raw) {
                assert_eq!(state as u32, raw);
            }
        }
        assert!(UpcallKind::Preempted.carries_context());
        assert!(!UpcallKind::Blocked.carries_context());
    }
}
