//! `poll` on one socket (what std's `connect_timeout` needs: a non-blocking `connect` answers
//! `EINPROGRESS`, then `poll(POLLOUT)` with the timeout). A receive buffer answers `POLLIN`
//! and a transmit ring `POLLOUT` in the guest; other sockets (a connect in progress, a
//! listener) ask the VMM (`NET_OP_POLL`), parked with the deadline
//! (`activm_rt::net_deadline::call_until`). More than one descriptor is `ENOSYS`.

use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::protocol::net::*;

use crate::errno::{fail, EINVAL, ENOSYS};
use crate::socket_call::{net, waiting_until};

const EINPROGRESS: i32 = 115;

/// hermit-abi's `pollfd` and bits (Linux's values).
#[repr(C)]
#[derive(Debug)]
pub struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}
const POLLIN: i16 = 0x1;
const POLLOUT: i16 = 0x4;
const POLLERR: i16 = 0x8;
const POLLHUP: i16 = 0x10;
const POLLNVAL: i16 = 0x20;

/// Sockets whose non-blocking connect is in progress (their buffers are set up once `poll`
/// sees it done), one bit per socket number.
static CONNECTING: [AtomicU64; NET_MAX_SOCKETS / 64] =
    [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

fn bit(s: u64) -> (&'static AtomicU64, u64) {
    (&CONNECTING[s as usize / 64], 1 << (s % 64))
}

/// A non-blocking connect of `s` would wait: `EINPROGRESS`, as on Linux.
pub fn connect_started(s: u64) -> i32 {
    let (word, b) = bit(s);
    word.fetch_or(b, Ordering::Relaxed);
    fail(EINPROGRESS)
}

/// `s` is closed or connected: no connect in progress.
pub fn forget(s: u64) {
    let (word, b) = bit(s);
    word.fetch_and(!b, Ordering::Relaxed);
}

/// `s`'s connect ended: connected, it gets its receive buffer and transmit ring.
fn connect_done(s: u64, revents: i16) {
    let (word, b) = bit(s);
    if word.fetch_and(!b, Ordering::Relaxed) & b != 0
        && revents & (POLLERR | POLLHUP) == 0
        && net(NET_OP_GETOPT, s, NET_OPT_ERROR, 0, 0) == 0
    {
        crate::socket_rx::set_up(s);
        crate::socket_tx::set_up(s);
    }
}

/// The VMM's answer for one direction of `s`, waiting until `deadline` (`Some(0)`: do not wait;
/// `None`: no deadline): the ready bits, 0 if none in time, or `-errno`.
fn ask_vmm(s: u64, events: u64, deadline: Option<u64>, wait: bool) -> i64 {
    let r = if wait {
        waiting_until(s, |tag| net(NET_OP_POLL, s, events, tag, 0), deadline)
    } else {
        net(NET_OP_POLL, s, events, NET_NO_WAIT, 0)
    };
    if r == -11 {
        0
    } else {
        r
    }
}

/// `int sys_poll(pollfd *fds, nfds_t nfds, int timeout)`: one socket descriptor (or none:
/// sleeps); `timeout` in milliseconds, negative for none.
///
/// # Safety
/// `fds` points to `nfds` writable `pollfd`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_poll(fds: *mut PollFd, nfds: usize, timeout: i32) -> i32 {
    if nfds == 0 {
        if timeout > 0 {
            activm_rt::thread::sleep(core::time::Duration::from_millis(timeout as u64));
        }
        return 0;
    }
    if nfds > 1 {
        return fail(ENOSYS);
    }
    if fds.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's contract (one pollfd).
    let pfd = unsafe { &mut *fds };
    pfd.revents = 0;
    let Some(s) = crate::socket_dup::resolve(pfd.fd) else {
        if crate::socket_dup::in_range(pfd.fd) {
            pfd.revents = POLLNVAL;
            return 1;
        }
        return fail(ENOSYS);
    };
    let deadline =
        (timeout > 0).then(|| activm_rt::net_deadline::deadline_in_ns(timeout as u64 * 1_000_000));
    let wait = timeout != 0;
    // One direction is waited for: writing if asked (a connect in progress), else reading.
    let (events, own) = if pfd.events & POLLOUT != 0 {
        (NET_WRITABLE, crate::socket_tx::room(s))
    } else if pfd.events & POLLIN != 0 {
        (NET_READABLE, crate::socket_rx::readable(s))
    } else {
        return 0;
    };
    let ready = match own {
        // The guest's buffer or ring answers (waiting with the deadline if need be).
        Some(_) => {
            let r = if events == NET_WRITABLE {
                crate::socket_tx::wait_room(s, deadline, wait)
            } else {
                crate::socket_rx::wait_readable(s, deadline, wait)
            };
            r as i64
        }
        None => ask_vmm(s, events, deadline, wait),
    };
    if ready < 0 {
        return fail(-ready as i32);
    }
    pfd.revents = (ready as i16) & (pfd.events | POLLERR | POLLHUP);
    if events == NET_WRITABLE && ready != 0 {
        connect_done(s, ready as i16);
    }
    i32::from(pfd.revents != 0)
}
