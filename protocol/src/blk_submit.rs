//! The submission ring of asynchronous block requests: requests without an exit.
//!
//! When `blk_info(BLK_INFO_FLAGS)` has [`BLK_FLAG_SUBMIT_RING`], a guest that registered its
//! completion ring ([`crate::blk::BlkRing`]) may also register a [`BlkSubmitRing`]
//! (`blk_submit_ring_setup(gpa)`). It then starts a request by writing it into the slot of its
//! tag and setting the tag's bit in [`BlkSubmitRing::submitted`]; a thread of the VMM (the
//! *consumer*) takes the bits and starts the requests exactly as `blk_submit` would have with
//! the same arguments, except that every result, even an immediate one, comes through the
//! completion ring. The guest rings the doorbell only when the consumer said it sleeps.
//!
//! **Slots by tag, not a queue.** Requests come from every vCPU at once, and a vCPU can lose
//! its processor at any instruction (a revoke). In a queue, a producer that reserved an entry
//! and was stopped before filling it would hold back every later entry. Here each tag owns its
//! slot, a request is published by one atomic OR, and the consumer takes all published bits
//! with one atomic swap: no producer ever waits for another. (Requests in flight have no order
//! among themselves in this device anyway, as with `blk_submit` from several vCPUs.)
//!
//! **The doorbell handshake** (no lost wake-up, no exit while the consumer is awake):
//!
//! ```text
//! guest (producer)                          VMM (consumer)
//! slots[tag] = request                      loop:
//! submitted.fetch_or(1 << tag)  [SeqCst]      take = submitted.swap(0); start them
//! if consumer == SLEEPING  [SeqCst load]      (a short bounded poll of `submitted`)
//!     ring the doorbell                       consumer = SLEEPING         [SeqCst]
//!                                             if submitted != 0 [SeqCst]: consumer = AWAKE, loop
//!                                             sleep until the doorbell; consumer = AWAKE
//! ```
//!
//! Both sides store, then load the other side's word, with sequentially consistent operations
//! (a full fence between the store and the load: `lock or` / `xchg` on x86, `ldaxr`/`stlxr` +
//! `dmb ish` on arm64), so at least one of them sees the other's store: either the consumer sees
//! the new bit and does not sleep, or the guest sees `SLEEPING` and rings. A spurious doorbell
//! (the consumer woke meanwhile) costs one wake-up and nothing else; the doorbell is counted,
//! not lost, if it comes before the consumer sleeps (an eventfd). Instead of ringing, a guest may
//! take its bit back (an atomic AND; it owns the request only if the bit was still set) and
//! submit the request with `blk_submit`: the consumer's swap and the guest's AND never both win.
//!
//! **Looking without a consumer awake** ([`BLK_CONSUMER_LOOKING`]). While the VMM has earlier
//! requests of the guest waiting for the device's latency, it looks at `submitted` anyway: at
//! every exit of the guest's vCPUs and whenever its disk's timer wakes for those requests, which
//! is before a request submitted now would be due (plus, while every vCPU of the guest is busy,
//! the guest's `nudge_us`: such a vCPU finds completions only when it schedules anyway). It
//! says so with `LOOKING`, and the guest submits without a doorbell; the device's latency counts
//! from the request's [`BlkSubmission::submitted_at`], so a request seen late is not completed
//! late for it. When the VMM stops looking it says `SLEEPING` the same way the consumer does
//! (store, then look at `submitted` once more; what it finds, its consumer takes).
//!
//! **The doorbell** is a 4-byte *store* of [`BLK_DOORBELL_RING`] to [`blk_doorbell_address`] in the hypercall page. The
//! VMM registers it with KVM as an ioeventfd, so the vCPU does not exit to the VMM at all (KVM
//! signals the consumer's eventfd and resumes the guest). A *load* from the same slot is the
//! `blk_doorbell` hypercall: the same doorbell through an ordinary exit, for comparison and for
//! hosts without ioeventfds (a store that reaches the VMM is handled the same way).
//!
//! Everything the guest writes is untrusted: the VMM checks each request as it checks
//! `blk_submit` (a tag in flight twice stops the guest), and a bit set for a tag whose slot
//! holds garbage is a request with garbage arguments, checked like any other.

use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::blk::BLK_RING_CAPACITY;
use crate::hypercall::Hypercall;
use crate::CacheAligned;

/// `blk_info(BLK_INFO_FLAGS)` bit: the VMM takes requests through a [`BlkSubmitRing`]
/// (`blk_submit_ring_setup`, the doorbell). Implies [`crate::blk::BLK_FLAG_ASYNC`].
pub const BLK_FLAG_SUBMIT_RING: u64 = 1 << 2;

/// [`BlkSubmitRing::consumer`]: the VMM's consumer looks at `submitted` on its own.
pub const BLK_CONSUMER_AWAKE: u32 = 0;
/// [`BlkSubmitRing::consumer`]: the consumer sleeps until the doorbell.
pub const BLK_CONSUMER_SLEEPING: u32 = 1;
/// [`BlkSubmitRing::consumer`]: no VMM thread polls, but the VMM looks at `submitted` on its
/// own before a request submitted now is due (when a vCPU of the guest exits, when the disk's
/// timer wakes for earlier requests): no doorbell, as with [`BLK_CONSUMER_AWAKE`].
pub const BLK_CONSUMER_LOOKING: u32 = 2;

/// One request in its tag's slot: the arguments `blk_submit` takes, tag aside.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkSubmission {
    pub sector: u64,
    /// Guest-physical buffer (nothing for a flush).
    pub gpa: u64,
    /// [`crate::blk::blk_submit_arg`]`(op, count)`.
    pub op_count: u64,
    /// The guest's timestamp counter (TSC on x86_64, CNTVCT_EL0 on aarch64) when it made the
    /// request, or 0: the device's latency counts from then (never from before the VMM's
    /// previous look at `submitted`, nor from after the look that takes the request).
    pub submitted_at: u64,
}

/// The submission ring: guest memory registered with `blk_submit_ring_setup(gpa)` (64-byte
/// aligned, in RAM at or above the image base, `submitted` 0 then), after the completion ring.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct BlkSubmitRing {
    /// Guest sets bit `tag` (atomic OR) after writing `slots[tag]`; the VMM takes bits (swap).
    pub submitted: CacheAligned<AtomicU64>,
    /// VMM writes: [`BLK_CONSUMER_AWAKE`] or [`BLK_CONSUMER_SLEEPING`].
    pub consumer: CacheAligned<AtomicU32>,
    /// Guest writes: one request per tag.
    pub slots: [BlkSubmission; BLK_RING_CAPACITY],
}

impl BlkSubmitRing {
    pub const fn new() -> BlkSubmitRing {
        const EMPTY: BlkSubmission = BlkSubmission {
            sector: 0,
            gpa: 0,
            op_count: 0,
            submitted_at: 0,
        };
        BlkSubmitRing {
            submitted: CacheAligned(AtomicU64::new(0)),
            consumer: CacheAligned(AtomicU32::new(BLK_CONSUMER_AWAKE)),
            slots: [EMPTY; BLK_RING_CAPACITY],
        }
    }
}

impl Default for BlkSubmitRing {
    fn default() -> BlkSubmitRing {
        BlkSubmitRing::new()
    }
}

/// The value the guest stores to ring the doorbell (the ioeventfd matches it).
pub const BLK_DOORBELL_RING: u32 = 1;

/// The doorbell: a 4-byte store of [`BLK_DOORBELL_RING`] here (an ioeventfd: no exit), or a load (the `blk_doorbell`
/// hypercall: an exit).
pub const fn blk_doorbell_address(hypercall_base: u64) -> u64 {
    Hypercall::BlkDoorbell.address(hypercall_base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_is_pinned() {
        assert_eq!(offset_of!(BlkSubmitRing, submitted), 0);
        assert_eq!(offset_of!(BlkSubmitRing, consumer), 64);
        assert_eq!(offset_of!(BlkSubmitRing, slots), 128);
        assert_eq!(size_of::<BlkSubmission>(), 32);
        assert_eq!(offset_of!(BlkSubmission, gpa), 8);
        assert_eq!(offset_of!(BlkSubmission, op_count), 16);
        assert_eq!(offset_of!(BlkSubmission, submitted_at), 24);
        assert_eq!(size_of::<BlkSubmitRing>(), 128 + 32 * 64);
        assert_eq!(align_of::<BlkSubmitRing>(), 64);
    }

    #[test]
    fn values_are_pinned() {
        assert_eq!(BLK_FLAG_SUBMIT_RING, 4);
        assert_eq!(
            (
                BLK_CONSUMER_AWAKE,
                BLK_CONSUMER_SLEEPING,
                BLK_CONSUMER_LOOKING
            ),
            (0, 1, 2)
        );
        assert_eq!(BLK_DOORBELL_RING, 1);
        assert_eq!(Hypercall::BlkSubmitRingSetup as u64, 38);
        assert_eq!(Hypercall::BlkDoorbell as u64, 39);
        assert_eq!(blk_doorbell_address(0x1000), 0x1000 + 8 * 39);
    }
}
