//! UDP sockets (`std::net::UdpSocket`): the `sys_*` calls of a socket made with `SOCK_DGRAM`
//! go to the VMM's `udp_*` operations (`protocol::net`), one exit per datagram; no receive
//! buffer or transmit ring. A call that would block parks the thread like TCP's, until the
//! socket's read or write timeout if it has one (`socket_timeout`: `EAGAIN`, std's
//! `WouldBlock`, as on Linux).

use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::protocol::net::*;

use crate::socket_call::{net, set_nonblocking, waiting_until};
use crate::socket_timeout;

/// UDP sockets, one bit per socket number.
static UDP: [AtomicU64; NET_MAX_SOCKETS / 64] = [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

/// Whether socket `s` is a UDP socket.
pub fn is_udp(s: u64) -> bool {
    UDP[s as usize / 64].load(Ordering::Relaxed) & (1 << (s % 64)) != 0
}

fn mark(s: u64, on: bool) {
    let bit = 1u64 << (s % 64);
    if on {
        UDP[s as usize / 64].fetch_or(bit, Ordering::Relaxed);
    } else {
        UDP[s as usize / 64].fetch_and(!bit, Ordering::Relaxed);
    }
}

/// A new UDP socket: its number, or `-errno`.
pub fn socket(nonblocking: bool) -> i64 {
    let r = net(NET_OP_SOCKET, 0, NET_KIND_UDP, 0, 0);
    if r >= 0 {
        mark(r as u64, true);
        set_nonblocking(r as u64, nonblocking);
        socket_timeout::reset(r as u64);
    }
    r
}

/// `connect`: the default peer (never waits).
pub fn connect(s: u64, addr: u64) -> i64 {
    net(NET_OP_UDP_CONNECT, s, addr, 0, 0)
}

/// One datagram to `addr` (0: the connected peer).
///
/// # Safety
/// `buf` points to `len` readable bytes.
pub unsafe fn send_to(s: u64, buf: *const u8, len: usize, addr: u64) -> i64 {
    if len as u64 > NET_UDP_MAX {
        return -90; // EMSGSIZE
    }
    let op = |tag: u64| {
        net(
            NET_OP_UDP_SENDTO,
            s,
            buf as u64,
            len as u64 | tag << 32,
            addr,
        )
    };
    waiting_until(s, op, socket_timeout::deadline(s, false))
}

/// One datagram into `buf` (truncated to `len`), its sender's packed address in `*peer`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
pub unsafe fn recv_from(s: u64, buf: *mut u8, len: usize, peek: bool, peer: &mut u64) -> i64 {
    let op = if peek {
        NET_OP_UDP_PEEKFROM
    } else {
        NET_OP_UDP_RECVFROM
    };
    let len = len.min(NET_UDP_MAX as usize) as u64;
    let peer_gpa = peer as *mut u64 as u64;
    let call = |tag: u64| net(op, s, buf as u64, len | tag << 32, peer_gpa);
    waiting_until(s, call, socket_timeout::deadline(s, true))
}

/// Closes UDP socket `s`.
pub fn close(s: u64) -> i64 {
    // Unmarked first: once the VMM closed it, a TCP `socket` may reuse the number at once.
    mark(s, false);
    let r = net(NET_OP_CLOSE, s, 0, 0, 0);
    if r != 0 {
        mark(s, true);
    }
    r
}
