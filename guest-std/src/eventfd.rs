//! `eventfd` (hermit-abi's `sys_eventfd(initval, flags)`): a 64-bit counter in the guest, no
//! exit. `write` adds 8 bytes' value, `read` takes the count (or 1 with `EFD_SEMAPHORE`);
//! `poll` is `POLLIN` while the count is not zero, `POLLOUT` while a write of 1 fits. A blocking
//! `read` or `write` waits through `sys_poll` on its own descriptor.
//!
//! A thread that waits for one (`sys_poll`, `crate::poll`) leaves its wait tag + 1 in one of
//! the counter's `waiters` words; a `write` (or a `read` that made room, or `close`) takes each
//! and reports it from the guest (`activm_rt::net::report_local`), waking that thread on
//! whatever vCPU it parked. Descriptors are [`EVENTFD_BASE`] + slot, the table static, so a
//! word stays valid memory after `close`.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::errno::{fail, EAGAIN, EBADF, EINVAL, EMFILE};
use crate::poll::{POLLIN, POLLNVAL, POLLOUT};

/// The first eventfd descriptor (above the socket descriptors).
pub const EVENTFD_BASE: i32 = 1 << 21;
/// Most eventfds open at once.
pub const MAX_EVENTFDS: usize = 256;
/// Threads that may wait for one eventfd at once (more wait in steps, `crate::poll`).
const WAITERS: usize = 4;
/// The largest count (a write that would pass it waits, or fails with `EAGAIN`).
const MAX_COUNT: u64 = u64::MAX - 1;

/// hermit-abi's flags (Linux's values).
const EFD_SEMAPHORE: i16 = 0o1;
const EFD_NONBLOCK: i16 = 0o4000;
const EFD_CLOEXEC: i16 = 0o40000;

const OPEN: u32 = 1;
const SEMAPHORE: u32 = 2;
const NONBLOCK: u32 = 4;
/// A slot being set up by `sys_eventfd` (not free, not open yet).
const TAKING: u32 = 8;

/// One eventfd.
#[derive(Debug)]
pub struct EventFd {
    /// 0: free; [`TAKING`]; or [`OPEN`] and the flags.
    state: AtomicU32,
    count: AtomicU64,
    /// Wait tags + 1 (0: none).
    waiters: [AtomicU32; WAITERS],
}

static TABLE: [EventFd; MAX_EVENTFDS] = [const {
    EventFd {
        state: AtomicU32::new(0),
        count: AtomicU64::new(0),
        waiters: [const { AtomicU32::new(0) }; WAITERS],
    }
}; MAX_EVENTFDS];

/// Whether `fd` lies in the eventfd descriptors' range (open or not).
pub fn in_range(fd: i32) -> bool {
    (EVENTFD_BASE..EVENTFD_BASE + MAX_EVENTFDS as i32).contains(&fd)
}

/// The eventfd `fd` names, open or not (`None`: not an eventfd descriptor).
pub fn slot(fd: i32) -> Option<&'static EventFd> {
    in_range(fd).then(|| &TABLE[(fd - EVENTFD_BASE) as usize])
}

impl EventFd {
    fn is_open(&self) -> bool {
        self.state.load(Ordering::SeqCst) & OPEN != 0
    }

    /// `poll`'s answer for `events` now (`POLLNVAL` once closed).
    pub fn ready(&self, events: i16) -> i16 {
        if !self.is_open() {
            return POLLNVAL;
        }
        let count = self.count.load(Ordering::SeqCst);
        let mut r = 0;
        if events & POLLIN != 0 && count > 0 {
            r |= POLLIN;
        }
        if events & POLLOUT != 0 && count < MAX_COUNT {
            r |= POLLOUT;
        }
        r
    }

    /// Leaves wait tag `tag` in a free waiter word: the word, or `None` if all are taken.
    pub fn watch(&self, tag: u32) -> Option<&AtomicU32> {
        self.waiters.iter().find(|w| {
            w.compare_exchange(0, tag + 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Reports every waiting tag (the count or the state changed).
    fn wake_all(&self) {
        for w in &self.waiters {
            if w.load(Ordering::SeqCst) != 0 {
                let v = w.swap(0, Ordering::SeqCst);
                if v != 0 {
                    activm_rt::net::report_local(v - 1);
                }
            }
        }
    }

    fn nonblocking(&self) -> bool {
        self.state.load(Ordering::Relaxed) & NONBLOCK != 0
    }
}

/// `int sys_eventfd(u64 initval, i16 flags)`: `EFD_NONBLOCK`, `EFD_SEMAPHORE`, `EFD_CLOEXEC`
/// (nothing to do); other flags or an `initval` above the largest count are `EINVAL`; `EMFILE`
/// past [`MAX_EVENTFDS`].
#[unsafe(no_mangle)]
pub extern "C" fn sys_eventfd(initval: u64, flags: i16) -> i32 {
    if flags & !(EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC) != 0 || initval > MAX_COUNT {
        return fail(EINVAL);
    }
    let mut state = OPEN;
    if flags & EFD_SEMAPHORE != 0 {
        state |= SEMAPHORE;
    }
    if flags & EFD_NONBLOCK != 0 {
        state |= NONBLOCK;
    }
    for (i, e) in TABLE.iter().enumerate() {
        // A slot is taken with a placeholder first, so the count is set before it is open.
        if e.state
            .compare_exchange(0, TAKING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            e.count.store(initval, Ordering::SeqCst);
            e.state.store(state, Ordering::SeqCst);
            return EVENTFD_BASE + i as i32;
        }
    }
    fail(EMFILE)
}

fn open_or_ebadf(fd: i32) -> Result<&'static EventFd, i32> {
    slot(fd).filter(|e| e.is_open()).ok_or(EBADF)
}

/// Waits (parked, `sys_poll`) until `fd` answers `events` or is closed.
fn wait(fd: i32, events: i16) {
    let mut pfd = crate::poll::PollFd::new(fd, events);
    // SAFETY: one pollfd on this stack.
    unsafe { crate::poll::sys_poll(&mut pfd, 1, -1) };
}

/// `read` of eventfd `fd`: 8 bytes, the count (reset to 0), or 1 with `EFD_SEMAPHORE`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
pub unsafe fn read(fd: i32, buf: *mut u8, len: usize) -> isize {
    if buf.is_null() || len < 8 {
        return fail(EINVAL) as isize;
    }
    loop {
        let e = match open_or_ebadf(fd) {
            Ok(e) => e,
            Err(errno) => return fail(errno) as isize,
        };
        let semaphore = e.state.load(Ordering::Relaxed) & SEMAPHORE != 0;
        let taken = e
            .count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                (c > 0).then_some(if semaphore { c - 1 } else { 0 })
            });
        if let Ok(before) = taken {
            let value = if semaphore { 1 } else { before };
            // SAFETY: at least 8 writable bytes (checked above).
            unsafe { core::ptr::write_unaligned(buf.cast::<u64>(), value) };
            e.wake_all(); // a writer may wait for room
            return 8;
        }
        if e.nonblocking() {
            return fail(EAGAIN) as isize;
        }
        wait(fd, POLLIN);
    }
}

/// `write` to eventfd `fd`: adds the 8 bytes' value (`u64::MAX` is `EINVAL`).
///
/// # Safety
/// `buf` points to `len` readable bytes.
pub unsafe fn write(fd: i32, buf: *const u8, len: usize) -> isize {
    if buf.is_null() || len < 8 {
        return fail(EINVAL) as isize;
    }
    // SAFETY: at least 8 readable bytes (checked above).
    let value = unsafe { core::ptr::read_unaligned(buf.cast::<u64>()) };
    if value == u64::MAX {
        return fail(EINVAL) as isize;
    }
    loop {
        let e = match open_or_ebadf(fd) {
            Ok(e) => e,
            Err(errno) => return fail(errno) as isize,
        };
        let added = e
            .count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                c.checked_add(value).filter(|&n| n <= MAX_COUNT)
            });
        if added.is_ok() {
            if value > 0 {
                e.wake_all();
            }
            return 8;
        }
        if e.nonblocking() {
            return fail(EAGAIN) as isize;
        }
        wait(fd, POLLOUT);
    }
}

/// `close` of eventfd `fd`: threads waiting for it are woken (their `poll` sees `POLLNVAL`).
pub fn close(fd: i32) -> i32 {
    let Some(e) = slot(fd) else {
        return fail(EBADF);
    };
    let state = e.state.load(Ordering::Acquire);
    if state & OPEN == 0
        || e.state
            .compare_exchange(state, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return fail(EBADF);
    }
    e.wake_all();
    0
}

/// `O_NONBLOCK` (`fcntl`) or `FIONBIO` (`ioctl`) on eventfd `fd`: `Err(EBADF)` if not open.
pub fn set_nonblocking(fd: i32, on: bool) -> Result<(), i32> {
    let e = slot(fd).ok_or(EBADF)?;
    e.state
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (s & OPEN != 0).then_some(if on { s | NONBLOCK } else { s & !NONBLOCK })
        })
        .map(drop)
        .map_err(|_| EBADF)
}

/// Whether eventfd `fd` is non-blocking (`fcntl(F_GETFL)`).
pub fn nonblocking(fd: i32) -> Result<bool, i32> {
    Ok(open_or_ebadf(fd)?.nonblocking())
}
