//! The block device: a disk image the VMM exposes through the `blk_*` hypercalls.
//!
//! Requests are synchronous for the calling thread: `blk_read` and `blk_write` return when the
//! data is in guest memory or in the host's hands. A request the host can serve at once (the
//! data is in its page cache) completes inside the exit; one that must wait (a cold read, a
//! device with latency, a flush) **blocks the vCPU in the VMM**. A guest that takes upcalls then
//! gets a BLOCKED record naming the activation while its processor runs a new activation, and an
//! UNBLOCKED record with the thread's context (the call's result in its result register) when the
//! request completes. An oblivious guest simply loses the vCPU for that long.
//!
//! The buffer is guest-physical, inside RAM at or above the image base; a buffer elsewhere, a
//! count of 0 or above [`BLK_MAX_SECTORS`] is a protocol violation that stops the guest. Errors of
//! the device itself are returned as `BLK_ERR_*`.

//!
//! **Asynchronous requests** (when `blk_info(BLK_INFO_FLAGS)` has [`BLK_FLAG_ASYNC`]): the guest
//! registers a [`BlkRing`] once (`blk_ring_setup`), then `blk_submit(sector, gpa,
//! blk_submit_arg(op, count), tag)` returns at once: the result itself when the request
//! completed inside the exit (page cache), else [`BLK_IN_FLIGHT`], and the VMM performs the
//! request on an I/O thread and puts `(tag, result)` into the ring. The vCPU never blocks; the
//! guest's scheduler runs other threads meanwhile.

use core::sync::atomic::AtomicU32;

use crate::CacheAligned;

/// Bytes per sector.
pub const SECTOR_SIZE: u64 = 512;

/// Largest `count` of one `blk_read` / `blk_write` (128 KiB).
pub const BLK_MAX_SECTORS: u64 = 256;

/// `blk_info` selectors.
pub const BLK_INFO_SECTORS: u64 = 0;
pub const BLK_INFO_FLAGS: u64 = 1;

/// `blk_info(BLK_INFO_FLAGS)` bit: writes are refused with [`BLK_ERR_READ_ONLY`].
pub const BLK_FLAG_READ_ONLY: u64 = 1 << 0;
/// `blk_info(BLK_INFO_FLAGS)` bit: the VMM takes asynchronous requests (`blk_ring_setup`,
/// `blk_submit`, see [`BlkRing`]). A VMM without it stops a guest that makes those calls.
pub const BLK_FLAG_ASYNC: u64 = 1 << 1;

/// The request completed.
pub const BLK_OK: u64 = 0;
/// The guest has no block device.
pub const BLK_ERR_NO_DEVICE: u64 = 1;
/// `sector + count` lies beyond the device's capacity.
pub const BLK_ERR_RANGE: u64 = 2;
/// A write to a read-only device.
pub const BLK_ERR_READ_ONLY: u64 = 3;
/// The host failed the request (its I/O error).
pub const BLK_ERR_IO: u64 = 4;

/// `blk_submit`'s result when the request goes on in the background: its completion will
/// appear in the guest's [`BlkRing`] under the request's tag.
pub const BLK_IN_FLIGHT: u64 = 0x100;

/// `blk_submit` operations (bits 32..40 of its third argument).
pub const BLK_OP_READ: u64 = 0;
pub const BLK_OP_WRITE: u64 = 1;
pub const BLK_OP_FLUSH: u64 = 2;

/// Completions in a [`BlkRing`], and the number of tags (`0..BLK_RING_CAPACITY`).
pub const BLK_RING_CAPACITY: usize = 64;

/// One completed asynchronous request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkCompletion {
    /// The tag `blk_submit` was given.
    pub tag: u64,
    /// `BLK_OK` or a `BLK_ERR_*` code.
    pub result: u64,
}

/// The completion ring of asynchronous block requests: guest memory the guest registers with
/// `blk_ring_setup(gpa)` (64-byte aligned, in RAM at or above the image base).
///
/// One producer (the VMM) and consumers on any vCPU of the guest. The VMM writes
/// `entries[head % CAP]`, then stores `head + 1` with release; the guest loads `head` with
/// acquire, copies `entries[tail..head]`, then stores the new `tail` with release.
///
/// Flow control by tags: a guest has at most [`BLK_RING_CAPACITY`] requests in flight or
/// completed-but-unconsumed (tags are unique among them), so the ring never overflows; a guest
/// that breaks this (a tag in flight twice, a tail moved past the head) is stopped.
///
/// Wake-ups: after publishing a completion the VMM reads `SharedHeader::idle_vcpus` and raises
/// the reschedule vector (`arch::RESCHEDULE_IRQ`) on one vCPU whose bit is set; vCPUs
/// that are not idle get no interrupt and must look at the ring when they schedule. (The guest
/// sets its idle bit, then looks at the ring, then halts; the VMM publishes `head`, then reads
/// the bits: one of the two sees the other.) If the guest sets `nudge_us`, a completion left
/// unconsumed that long makes the VMM raise the same vector on a running vCPU (the guest asks
/// for that wake-up: its busy vCPUs may not schedule for a while).
///
/// Timing: a completion is never posted before its due time (the device's latency), but while
/// the guest marks no vCPU idle and one runs, it may be posted up to `nudge_us` later (500 us if
/// 0), by the first exit of a vCPU or the VMM's timer. What the VMM posts while handling a
/// vCPU's `blk_submit`, `blk_doorbell` or `halt` (which then returns at once), or while starting
/// a new activation, gets neither interrupt nor nudge: that vCPU goes to its scheduler, which must
/// take the ring before it runs a thread.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct BlkRing {
    /// VMM writes: producer index (free-running).
    pub head: CacheAligned<AtomicU32>,
    /// Guest writes: consumer index (free-running).
    pub tail: CacheAligned<AtomicU32>,
    /// Guest writes: microseconds a completion may stay unconsumed before the VMM interrupts a
    /// running vCPU (0: never; only idle vCPUs are interrupted).
    pub nudge_us: CacheAligned<AtomicU32>,
    /// VMM writes.
    pub entries: [BlkCompletion; BLK_RING_CAPACITY],
}

impl BlkRing {
    pub const fn new() -> BlkRing {
        BlkRing {
            head: CacheAligned(AtomicU32::new(0)),
            tail: CacheAligned(AtomicU32::new(0)),
            nudge_us: CacheAligned(AtomicU32::new(0)),
            entries: [BlkCompletion { tag: 0, result: 0 }; BLK_RING_CAPACITY],
        }
    }
}

impl Default for BlkRing {
    fn default() -> BlkRing {
        BlkRing::new()
    }
}

/// `blk_submit`'s third argument: `count` sectors and operation `op` (`BLK_OP_*`).
pub const fn blk_submit_arg(op: u64, count: u64) -> u64 {
    (op << 32) | (count & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn ring_layout() {
        assert_eq!(offset_of!(BlkRing, head), 0);
        assert_eq!(offset_of!(BlkRing, tail), 64);
        assert_eq!(offset_of!(BlkRing, nudge_us), 128);
        assert_eq!(offset_of!(BlkRing, entries), 192);
        assert_eq!(size_of::<BlkCompletion>(), 16);
        assert_eq!(size_of::<BlkRing>(), 192 + 16 * 64);
        assert_eq!(core::mem::align_of::<BlkRing>(), 64);
        assert_eq!(offset_of!(BlkCompletion, result), 8);
        assert_eq!(
            (BLK_IN_FLIGHT, BLK_OP_READ, BLK_OP_WRITE, BLK_OP_FLUSH),
            (0x100, 0, 1, 2)
        );
        assert_eq!(BLK_FLAG_ASYNC, 2);
        assert_eq!(blk_submit_arg(BLK_OP_WRITE, 8), (1 << 32) | 8);
    }

    #[test]
    fn values_are_pinned() {
        assert_eq!(SECTOR_SIZE, 512);
        assert_eq!(BLK_MAX_SECTORS, 256);
        assert_eq!(
            [
                BLK_OK,
                BLK_ERR_NO_DEVICE,
                BLK_ERR_RANGE,
                BLK_ERR_READ_ONLY,
                BLK_ERR_IO
            ],
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            (BLK_INFO_SECTORS, BLK_INFO_FLAGS, BLK_FLAG_READ_ONLY),
            (0, 1, 1)
        );
    }
}
