//! The block device (`protocol::blk`, `activm run --disk IMAGE`), for threads.
//!
//! A call blocks the calling thread only. When the VMM takes asynchronous requests
//! (`BLK_FLAG_ASYNC`; `--rt-blk-async=off` turns it off) the request is submitted with
//! `blk_submit` and the thread parks in this runtime until its completion shows up in the ring
//! (`blk_async.rs`): the vCPU goes on with other threads, with or without activations.
//! Otherwise the synchronous calls: with scheduler activations the vCPU blocks in the VMM, the
//! VMM tells the runtime (BLOCKED), the processor goes on running the guest's other threads (as
//! a new activation), and the thread becomes runnable again on whatever vCPU gets its
//! UNBLOCKED record, the call's result in its registers; without activations the whole vCPU
//! waits. Requests the host can serve at once (data in its page cache) do not block at all.

use activm_stub::hypercall;
use activm_stub::protocol::blk::{
    BLK_ERR_IO, BLK_ERR_NO_DEVICE, BLK_ERR_RANGE, BLK_ERR_READ_ONLY, BLK_FLAG_READ_ONLY,
    BLK_INFO_FLAGS, BLK_INFO_SECTORS, BLK_MAX_SECTORS, BLK_OK, BLK_OP_FLUSH, BLK_OP_READ,
    BLK_OP_WRITE,
};

/// Whether requests go asynchronously through the VMM's completion ring (known after the
/// first request).
pub use crate::blk_async::in_use as asynchronous;
pub(crate) use crate::blk_async::{completions_ready, poll_completions, requests_in_flight};

pub use activm_stub::protocol::blk::SECTOR_SIZE;

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The guest has no disk (`activm run` without `--disk`).
    NoDevice,
    /// The request reaches past the end of the disk.
    OutOfRange,
    /// A write to a disk attached with `--disk-read-only`.
    ReadOnly,
    /// The host failed the request.
    Io,
    /// The buffer is not a whole number of sectors.
    BadLength,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Error::NoDevice => "no block device",
            Error::OutOfRange => "beyond the end of the disk",
            Error::ReadOnly => "the disk is read-only",
            Error::Io => "I/O error on the host",
            Error::BadLength => "buffer length is not a multiple of the sector size",
        })
    }
}

impl core::error::Error for Error {}

fn result(code: u64) -> Result<(), Error> {
    match code {
        BLK_OK => Ok(()),
        BLK_ERR_NO_DEVICE => Err(Error::NoDevice),
        BLK_ERR_RANGE => Err(Error::OutOfRange),
        BLK_ERR_READ_ONLY => Err(Error::ReadOnly),
        BLK_ERR_IO => Err(Error::Io),
        _ => Err(Error::Io),
    }
}

/// The disk's size in sectors (0: no disk).
pub fn capacity() -> u64 {
    hypercall::blk_info(BLK_INFO_SECTORS)
}

/// Whether writes are refused.
pub fn read_only() -> bool {
    hypercall::blk_info(BLK_INFO_FLAGS) & BLK_FLAG_READ_ONLY != 0
}

/// A thread may block in the VMM only while it holds no runtime spinlock (its vCPU would stop
/// with the lock held).
fn check_no_hold(what: &str) {
    if activm_stub::preempt::held() != 0 {
        panic!("activm_rt::blk::{what} called while holding a runtime spinlock");
    }
}

fn sectors(len: usize) -> Result<u64, Error> {
    if !(len as u64).is_multiple_of(SECTOR_SIZE) {
        return Err(Error::BadLength);
    }
    Ok(len as u64 / SECTOR_SIZE)
}

/// Reads `buf.len() / SECTOR_SIZE` sectors starting at `sector`.
pub fn read(sector: u64, buf: &mut [u8]) -> Result<(), Error> {
    check_no_hold("read");
    let total = sectors(buf.len())?;
    let mut done = 0;
    while done < total {
        let count = (total - done).min(BLK_MAX_SECTORS);
        let at = (done * SECTOR_SIZE) as usize;
        let ptr = buf[at..].as_mut_ptr();
        // SAFETY: `buf[at..]` is live, writable, identity-mapped guest memory (all of the
        // runtime's memory is at or above the image base) of at least `count` sectors, and
        // borrowed mutably until the request completes (`request` returns only then).
        let code = unsafe {
            crate::blk_async::request(BLK_OP_READ, sector + done, ptr as u64, count, || {
                hypercall::blk_read(sector + done, ptr, count)
            })
        };
        result(code)?;
        done += count;
    }
    Ok(())
}

/// Writes `buf` (a whole number of sectors) starting at `sector`.
pub fn write(sector: u64, buf: &[u8]) -> Result<(), Error> {
    check_no_hold("write");
    let total = sectors(buf.len())?;
    let mut done = 0;
    while done < total {
        let count = (total - done).min(BLK_MAX_SECTORS);
        let at = (done * SECTOR_SIZE) as usize;
        let ptr = buf[at..].as_ptr();
        // SAFETY: as in `read`; the VMM only reads the buffer.
        let code = unsafe {
            crate::blk_async::request(BLK_OP_WRITE, sector + done, ptr as u64, count, || {
                hypercall::blk_write(sector + done, ptr, count)
            })
        };
        result(code)?;
        done += count;
    }
    Ok(())
}

/// Makes every completed write durable.
pub fn flush() -> Result<(), Error> {
    check_no_hold("flush");
    // SAFETY: a flush has no buffer.
    result(unsafe { crate::blk_async::request(BLK_OP_FLUSH, 0, 0, 0, hypercall::blk_flush) })
}
