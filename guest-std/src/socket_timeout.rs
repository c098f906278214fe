//! Socket timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`: std's `set_read_timeout` and
//! `set_write_timeout`), kept in the guest per socket number: a `recv`, `accept` (receive
//! timeout) or `send` (send timeout) that would wait longer parks with a deadline
//! (`activm_rt::net_deadline`) and then fails with `EAGAIN`, as on Linux (std: `WouldBlock`).
//! The wait holds no processor; the VMM knows nothing of timeouts.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::net::NET_MAX_SOCKETS;

/// hermit-abi's option names.
pub const SO_SNDTIMEO: i32 = 0x1005;
pub const SO_RCVTIMEO: i32 = 0x1006;

/// hermit-abi's `timeval`: `tv_sec: i64`, `tv_usec: i32` (16 bytes with padding).
const TIMEVAL_BYTES: usize = 16;

/// Nanoseconds, 0 for none.
static RECEIVE: [AtomicU64; NET_MAX_SOCKETS] = [const { AtomicU64::new(0) }; NET_MAX_SOCKETS];
static SEND: [AtomicU64; NET_MAX_SOCKETS] = [const { AtomicU64::new(0) }; NET_MAX_SOCKETS];

fn table(optname: i32) -> &'static [AtomicU64; NET_MAX_SOCKETS] {
    if optname == SO_RCVTIMEO {
        &RECEIVE
    } else {
        &SEND
    }
}

/// A new socket number (created or accepted): no timeouts.
pub fn reset(s: u64) {
    RECEIVE[s as usize].store(0, Ordering::Relaxed);
    SEND[s as usize].store(0, Ordering::Relaxed);
}

/// `setsockopt(SO_RCVTIMEO | SO_SNDTIMEO)`: a `timeval`; zero clears. `Err(errno)` for a
/// short or negative one.
///
/// # Safety
/// `optval` points to `optlen` readable bytes.
pub unsafe fn set(s: u64, optname: i32, optval: *const u8, optlen: u32) -> Result<(), i32> {
    if (optlen as usize) < TIMEVAL_BYTES {
        return Err(crate::errno::EINVAL);
    }
    // SAFETY: at least 16 readable bytes (checked above).
    let (sec, usec) = unsafe {
        (
            core::ptr::read_unaligned(optval.cast::<i64>()),
            core::ptr::read_unaligned(optval.add(8).cast::<i32>()),
        )
    };
    if sec < 0 || !(0..1_000_000).contains(&usec) {
        return Err(crate::errno::EINVAL);
    }
    let ns = (sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(usec as u64 * 1000);
    table(optname)[s as usize].store(ns, Ordering::Relaxed);
    Ok(())
}

/// `getsockopt(SO_RCVTIMEO | SO_SNDTIMEO)`: the `timeval` (zero: none), as much as fits.
///
/// # Safety
/// `optval` points to `room` writable bytes.
pub unsafe fn get(s: u64, optname: i32, optval: *mut u8, room: usize) -> usize {
    let ns = table(optname)[s as usize].load(Ordering::Relaxed);
    let mut tv = [0u8; TIMEVAL_BYTES];
    tv[..8].copy_from_slice(&((ns / 1_000_000_000) as i64).to_ne_bytes());
    tv[8..12].copy_from_slice(&(((ns % 1_000_000_000) / 1000) as i32).to_ne_bytes());
    let n = room.min(TIMEVAL_BYTES);
    // SAFETY: the caller's contract; `n <= room`.
    unsafe { core::ptr::copy_nonoverlapping(tv.as_ptr(), optval, n) };
    TIMEVAL_BYTES
}

/// The deadline (TSC) of a receive (`send`: false) or send on `s` starting now, if it has a
/// timeout.
pub fn deadline(s: u64, receive: bool) -> Option<u64> {
    let ns = if receive { &RECEIVE } else { &SEND }[s as usize].load(Ordering::Relaxed);
    (ns != 0).then(|| activm_rt::net_deadline::deadline_in_ns(ns))
}

/// Parks until the VMM reports `waiter` (or `ready()`), or until `deadline`: whether the
/// deadline passed (the caller then answers `-EAGAIN`).
pub fn wait_for(waiter: &AtomicU32, ready: impl Fn() -> bool, deadline: Option<u64>) -> bool {
    match deadline {
        None => {
            activm_rt::net::wait_for(waiter, ready);
            false
        }
        Some(d) => activm_rt::net_deadline::wait_for_until(waiter, ready, d),
    }
}
