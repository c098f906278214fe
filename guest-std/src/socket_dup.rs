//! `dup` of socket descriptors (std's `TcpStream::try_clone`): several descriptors name one
//! VMM socket, whose receive buffer, transmit ring, options and timeouts stay per socket.
//! Closing a descriptor closes the socket only when it was the last one naming it.
//!
//! A socket's first descriptor is `SOCKET_FD_BASE + number`; copies are
//! [`DUP_FD_BASE`]` + slot`, a slot holding the socket's number + 1. `EXTRA[s]` counts the
//! open descriptors of socket `s` beyond one; a closed first descriptor whose copies remain is
//! marked in `FIRST_CLOSED` (it names nothing until the socket is closed and its number reused).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::net::NET_MAX_SOCKETS;

use crate::errno::{fail, EBADF, EMFILE, ENOSYS};

/// The first socket descriptor (below: the standard streams and files).
pub const SOCKET_FD_BASE: i32 = 1 << 20;

/// The first descriptor of a copy.
pub const DUP_FD_BASE: i32 = SOCKET_FD_BASE + NET_MAX_SOCKETS as i32;
/// Most copies open at once.
pub const MAX_DUPS: usize = 1024;

static DUPS: [AtomicU32; MAX_DUPS] = [const { AtomicU32::new(0) }; MAX_DUPS];
static EXTRA: [AtomicU32; NET_MAX_SOCKETS] = [const { AtomicU32::new(0) }; NET_MAX_SOCKETS];
static FIRST_CLOSED: [AtomicU64; NET_MAX_SOCKETS / 64] =
    [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

fn first_closed(s: u64) -> (&'static AtomicU64, u64) {
    (&FIRST_CLOSED[s as usize / 64], 1 << (s % 64))
}

/// Whether `fd` lies in the socket descriptors' range (open or not).
pub fn in_range(fd: i32) -> bool {
    (SOCKET_FD_BASE..DUP_FD_BASE + MAX_DUPS as i32).contains(&fd)
}

/// The socket `fd` names, if it is an open socket descriptor.
pub fn resolve(fd: i32) -> Option<u64> {
    if (SOCKET_FD_BASE..DUP_FD_BASE).contains(&fd) {
        let s = (fd - SOCKET_FD_BASE) as u64;
        let (word, bit) = first_closed(s);
        return (word.load(Ordering::Acquire) & bit == 0).then_some(s);
    }
    if (DUP_FD_BASE..DUP_FD_BASE + MAX_DUPS as i32).contains(&fd) {
        let v = DUPS[(fd - DUP_FD_BASE) as usize].load(Ordering::Acquire);
        return (v != 0).then(|| u64::from(v - 1));
    }
    None
}

/// Closes descriptor `fd` of socket `s`: whether it was the socket's last descriptor (the
/// caller then closes the socket).
pub fn release(fd: i32, s: u64) -> bool {
    let mut n = EXTRA[s as usize].load(Ordering::Acquire);
    let last = loop {
        if n == 0 {
            break true;
        }
        match EXTRA[s as usize].compare_exchange(n, n - 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break false,
            Err(now) => n = now,
        }
    };
    let (word, bit) = first_closed(s);
    if fd >= DUP_FD_BASE {
        DUPS[(fd - DUP_FD_BASE) as usize].store(0, Ordering::Release);
        if last {
            // The socket's number may name a new socket right after its close.
            word.fetch_and(!bit, Ordering::AcqRel);
        }
    } else if !last {
        word.fetch_or(bit, Ordering::AcqRel);
    }
    last
}

/// `int sys_dup(int fd)`: a socket descriptor's copy; `ENOSYS` for other descriptors.
#[unsafe(no_mangle)]
pub extern "C" fn sys_dup(fd: i32) -> i32 {
    let Some(s) = resolve(fd) else {
        return fail(if in_range(fd) { EBADF } else { ENOSYS });
    };
    // Counted first: a concurrent close of another descriptor then leaves the socket open.
    EXTRA[s as usize].fetch_add(1, Ordering::AcqRel);
    for (slot, d) in DUPS.iter().enumerate() {
        if d.compare_exchange(0, s as u32 + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return DUP_FD_BASE + slot as i32;
        }
    }
    EXTRA[s as usize].fetch_sub(1, Ordering::AcqRel);
    fail(EMFILE)
}
