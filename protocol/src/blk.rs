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

/// Bytes per sector.
pub const SECTOR_SIZE: u64 = 512;

/// Largest `count` of one `blk_read` / `blk_write` (128 KiB).
pub const BLK_MAX_SECTORS: u64 = 256;

/// `blk_info` selectors.
pub const BLK_INFO_SECTORS: u64 = 0;
pub const BLK_INFO_FLAGS: u64 = 1;

/// `blk_info(BLK_INFO_FLAGS)` bit: writes are refused with [`BLK_ERR_READ_ONLY`].
pub const BLK_FLAG_READ_ONLY: u64 = 1 << 0;

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

#[cfg(test)]
mod tests {
    use super::*;

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
