//! `poll` (hermit-abi's `sys_poll`) on any number of descriptors, with a timeout in
//! milliseconds (0: look only; negative: none). What mio's poll selector, hence tokio, waits in.
//!
//! Readiness is looked up where it lives: a stream's receive buffer (`POLLIN`) and transmit ring
//! (`POLLOUT`) and an eventfd's counter in the guest, without an exit; other sockets (listeners,
//! connects in progress, UDP, streams without buffers) by asking the VMM (`NET_OP_POLL`, one
//! exit each). Files and the standard streams are always ready; a closed socket or eventfd
//! descriptor, or one activm does not know, answers `POLLNVAL`.
//!
//! When nothing is ready the thread waits for all of them at once (`activm_rt::net_any`): a
//! wait tag per source (the buffer's or ring's `waiter` word, the eventfd's, or a `NET_OP_POLL`
//! armed under the tag), one park until the first report or the deadline, no processor held;
//! then every tag is taken back and the descriptors are looked at again. If a source cannot
//! take a tag (another thread waits on the same buffer or direction, an eventfd with four
//! waiters, every tag in use) the wait lasts at most 1 ms and is repeated.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use activm_rt::net_any::AnyWait;
use activm_stub::protocol::fs::{FS_FIRST_FD, FS_MAX_FDS};
use activm_stub::protocol::net::*;

use crate::errno::{fail, EFAULT, EINVAL};
use crate::socket_call::net;

/// hermit-abi's `pollfd` (Linux's layout).
#[repr(C)]
#[derive(Debug)]
pub struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

impl PollFd {
    /// A `pollfd` for `fd` and `events`.
    pub fn new(fd: i32, events: i16) -> PollFd {
        PollFd {
            fd,
            events,
            revents: 0,
        }
    }
}

/// hermit-abi's bits (Linux's values).
pub const POLLIN: i16 = 0x1;
pub const POLLOUT: i16 = 0x4;
pub const POLLERR: i16 = 0x8;
pub const POLLHUP: i16 = 0x10;
pub const POLLNVAL: i16 = 0x20;

/// Most descriptors one `poll` takes (`EINVAL` above, as Linux past `RLIMIT_NOFILE`).
pub const MAX_POLL_FDS: usize = 4096;

/// How long a wait lasts when a source could not take a tag.
const STEP_NS: u64 = 1_000_000;

const EAGAIN: i64 = 11;
const ENOTCONN: i64 = 107;

/// The VMM's readiness of one direction (`NET_READABLE` or `NET_WRITABLE`) of socket `s`, now.
fn vmm_now(s: u64, direction: u64) -> i16 {
    match net(NET_OP_POLL, s, direction, NET_NO_WAIT, 0) {
        // Not ready, or (`EINVAL`) a buffer or ring appeared meanwhile: the next look sees it;
        // `EINTR` (a VMM before 2026-11-29 gave it when its thread was kicked): look again.
        r if r == -EAGAIN || r == -22 || r == -4 => 0,
        r if r == -ENOTCONN => POLLHUP,
        r if r < 0 => POLLERR,
        r => r as i16,
    }
}

/// What socket `s` answers for `events` now.
fn socket_now(s: u64, events: i16) -> i16 {
    let mut r = 0;
    if events & POLLIN != 0 {
        r |= match crate::socket_rx::readable(s) {
            Some(()) => crate::socket_rx::wait_readable(s, None, false),
            None => vmm_now(s, NET_READABLE),
        };
    }
    if events & POLLOUT != 0 {
        r |= match crate::socket_tx::room(s) {
            Some(()) => crate::socket_tx::wait_room(s, None, false),
            None => {
                let w = vmm_now(s, NET_WRITABLE);
                if w != 0 {
                    crate::socket_poll::connect_done(s, w);
                }
                w
            }
        };
    }
    r
}

/// What descriptor `fd` answers for `events` now (`revents`).
fn fd_now(fd: i32, events: i16) -> i16 {
    if fd < 0 {
        return 0;
    }
    let r = if let Some(s) = crate::socket_dup::resolve(fd) {
        socket_now(s, events)
    } else if let Some(e) = crate::eventfd::slot(fd) {
        e.ready(events)
    } else if crate::socket_dup::in_range(fd) {
        POLLNVAL
    } else if (fd as u64) < FS_FIRST_FD + FS_MAX_FDS as u64 {
        // The standard streams and files: never wait.
        events & (POLLIN | POLLOUT)
    } else {
        POLLNVAL
    };
    r & (events | POLLERR | POLLHUP | POLLNVAL)
}

/// Looks at every descriptor once: how many answered.
fn scan(fds: &mut [PollFd]) -> i32 {
    let mut n = 0;
    for pfd in fds.iter_mut() {
        pfd.revents = fd_now(pfd.fd, pfd.events);
        n += i32::from(pfd.revents != 0);
    }
    n
}

/// Where a tag was left.
enum Source {
    /// A buffer's, ring's or eventfd's `waiter` word (tag + 1).
    Word(&'static AtomicU32),
    /// A `NET_OP_POLL` of this socket and direction armed under the tag.
    Vmm(u64, u64),
}

impl Source {
    fn same(&self, other: &Source) -> bool {
        match (self, other) {
            (Source::Word(a), Source::Word(b)) => core::ptr::eq(*a, *b),
            (Source::Vmm(s, d), Source::Vmm(t, e)) => (s, d) == (t, e),
            _ => false,
        }
    }
}

/// How arming the sources went.
#[derive(PartialEq)]
enum Armed {
    /// Every source holds a tag: park.
    All,
    /// One is ready already: look again.
    Ready,
    /// One could not take a tag: wait a step at most.
    Busy,
}

/// Leaves a tag with one direction (`POLLIN` or `POLLOUT`) of descriptor `fd` (`vmm`: the VMM
/// can report tags).
fn arm(w: &AnyWait, vmm: bool, fd: i32, event: i16, armed: &mut Vec<(Source, u32)>) -> Armed {
    if let Some(e) = crate::eventfd::slot(fd) {
        // Any free word of the counter's (the same eventfd twice takes two).
        let Some(tag) = w.tag() else {
            return Armed::Busy;
        };
        let Some(word) = e.watch(tag) else {
            w.release(tag);
            return Armed::Busy;
        };
        armed.push((Source::Word(word), tag));
        return if e.ready(event) != 0 {
            Armed::Ready
        } else {
            Armed::All
        };
    }
    let Some(s) = crate::socket_dup::resolve(fd) else {
        return Armed::Ready; // closed meanwhile: the next look answers POLLNVAL
    };
    if !vmm {
        return Armed::Busy; // no ring for the VMM's reports: wait in steps
    }
    let (word, direction) = if event == POLLIN {
        (crate::socket_rx::waiter_word(s), NET_READABLE)
    } else {
        (crate::socket_tx::waiter_word(s), NET_WRITABLE)
    };
    let source = match word {
        Some(word) => Source::Word(word),
        None => Source::Vmm(s, direction),
    };
    if armed.iter().any(|(a, _)| a.same(&source)) {
        return Armed::All; // the same socket twice in the array: armed already
    }
    let Some(tag) = w.tag() else {
        return Armed::Busy;
    };
    match source {
        Source::Word(word) => {
            if word
                .compare_exchange(0, tag + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                w.release(tag); // another thread waits on this buffer or ring
                return Armed::Busy;
            }
            armed.push((source, tag));
            if socket_now(s, event) != 0 {
                Armed::Ready
            } else {
                Armed::All
            }
        }
        Source::Vmm(..) => {
            let r = net(NET_OP_POLL, s, direction, u64::from(tag), 0);
            if r == NET_WAITING as i64 {
                armed.push((source, tag));
                return Armed::All;
            }
            w.release(tag);
            // Another thread waits for this direction (`EAGAIN`): step; else look again.
            if r == -EAGAIN {
                Armed::Busy
            } else {
                Armed::Ready
            }
        }
    }
}

/// Takes every tag back (see `activm_rt::net_any`).
fn withdraw(w: &AnyWait, armed: &[(Source, u32)]) {
    for (source, tag) in armed {
        let back = match source {
            Source::Word(word) => word
                .compare_exchange(tag + 1, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok(),
            Source::Vmm(s, _) => net(NET_OP_CANCEL, *s, u64::from(*tag), 0, 0) == 0,
        };
        if back {
            w.release(*tag);
        } else {
            w.abandon(*tag);
        }
    }
}

/// One wait for the first of `fds`' sources, until TSC `deadline` at the latest: whether the
/// deadline passed.
fn wait_round(fds: &[PollFd], deadline: Option<u64>) -> bool {
    let step = || {
        let until = activm_rt::net_deadline::deadline_in_ns(STEP_NS);
        let until = deadline.map_or(until, |d| d.min(until));
        activm_rt::net_deadline::wait_until(until);
        deadline.is_some_and(activm_rt::net_deadline::passed)
    };
    // Allocated before the wait is armed (nothing may wait in between).
    let mut armed: Vec<(Source, u32)> = Vec::with_capacity(fds.len() * 2);
    let vmm = activm_rt::net_any::vmm_reports();
    let w = AnyWait::begin(deadline);
    let mut how = Armed::All;
    'fds: for pfd in fds.iter().filter(|p| p.fd >= 0) {
        for event in [POLLIN, POLLOUT] {
            if pfd.events & event != 0 {
                how = arm(&w, vmm, pfd.fd, event, &mut armed);
                if how != Armed::All {
                    break 'fds;
                }
            }
        }
    }
    w.park(how != Armed::All);
    withdraw(&w, &armed);
    let timed_out = w.end();
    if how == Armed::Busy && !timed_out {
        return step();
    }
    timed_out
}

/// `int sys_poll(pollfd *fds, nfds_t nfds, int timeout)`: the number of descriptors with
/// `revents` set, 0 if none within `timeout` ms (negative: no timeout), or `-errno`: `EFAULT`
/// for a null or misaligned `fds`, `EINVAL` for more than [`MAX_POLL_FDS`].
///
/// # Safety
/// `fds` points to `nfds` writable `pollfd`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_poll(fds: *mut PollFd, nfds: usize, timeout: i32) -> i32 {
    if nfds > MAX_POLL_FDS {
        return fail(EINVAL);
    }
    if nfds > 0 && (fds.is_null() || !fds.is_aligned()) {
        return fail(EFAULT);
    }
    let fds: &mut [PollFd] = if nfds == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract (non-null and aligned, checked above).
        unsafe { core::slice::from_raw_parts_mut(fds, nfds) }
    };
    let deadline =
        (timeout > 0).then(|| activm_rt::net_deadline::deadline_in_ns(timeout as u64 * 1_000_000));
    loop {
        let n = scan(fds);
        if n > 0 || timeout == 0 {
            return n;
        }
        if fds
            .iter()
            .all(|p| p.fd < 0 || p.events & (POLLIN | POLLOUT) == 0)
        {
            // Nothing to wait for but the timeout.
            match deadline {
                Some(d) => {
                    activm_rt::net_deadline::wait_until(d);
                    return 0;
                }
                None => activm_rt::thread::sleep(core::time::Duration::from_secs(3600)),
            }
            continue;
        }
        if wait_round(fds, deadline) {
            return scan(fds);
        }
    }
}
