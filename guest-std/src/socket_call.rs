//! A socket's calls to the VMM's socket proxy (`protocol::net`): the `Net` hypercall, and the
//! same call parked in activm-rt while it would block, unless the socket is non-blocking (one
//! bit per socket number). The layer under the `sys_*` functions (`socket.rs`) and under the
//! receive buffers and transmit rings (`socket_rx.rs`, `socket_tx.rs`).

use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::hypercall;
use activm_stub::protocol::hypercall::Hypercall;
use activm_stub::protocol::net::{net_arg, NET_MAX_SOCKETS, NET_NO_WAIT, NET_OP_CANCEL};

/// Non-blocking sockets, one bit per socket number.
static NONBLOCKING: [AtomicU64; NET_MAX_SOCKETS / 64] =
    [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

/// Whether socket `s` is non-blocking (`SOCK_NONBLOCK`, `FIONBIO`).
pub fn nonblocking(s: u64) -> bool {
    NONBLOCKING[s as usize / 64].load(Ordering::Relaxed) & (1 << (s % 64)) != 0
}

/// Makes socket `s` non-blocking (`on`) or blocking.
pub fn set_nonblocking(s: u64, on: bool) {
    let bit = 1u64 << (s % 64);
    let word = &NONBLOCKING[s as usize / 64];
    if on {
        word.fetch_or(bit, Ordering::Relaxed);
    } else {
        word.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// The `Net` hypercall: operation `op` on socket `s`.
#[inline]
pub fn net(op: u64, s: u64, a1: u64, a2: u64, a3: u64) -> i64 {
    // SAFETY: callers pass buffers that stay live and unshared for the call.
    unsafe { hypercall::raw(Hypercall::Net as u64, net_arg(op, s), a1, a2, a3) as i64 }
}

/// An operation that may wait: `op(tag)`, parked in the runtime while it would block.
pub fn waiting(s: u64, mut op: impl FnMut(u64) -> i64) -> i64 {
    if nonblocking(s) {
        return op(NET_NO_WAIT);
    }
    // SAFETY: `op` makes the `net` call with buffers its caller keeps live until we return.
    unsafe { activm_rt::net::call(|tag| op(tag) as u64) as i64 }
}

/// [`waiting`] with a deadline (TSC; `None`: none): `-EAGAIN` once it passed. A wait still
/// armed then is taken back (`cancel`), so no report of it comes later.
pub fn waiting_until(s: u64, mut op: impl FnMut(u64) -> i64, deadline: Option<u64>) -> i64 {
    let Some(deadline) = deadline else {
        return waiting(s, op);
    };
    if nonblocking(s) {
        return op(NET_NO_WAIT);
    }
    let cancel = |tag: u32| net(NET_OP_CANCEL, s, u64::from(tag), 0, 0) == 0;
    // SAFETY: as in `waiting`.
    match unsafe { activm_rt::net_deadline::call_until(|tag| op(tag) as u64, cancel, deadline) } {
        Some(r) => r as i64,
        None => -11,
    }
}
