//! The timer thread's clock: a one-shot CLOCK_MONOTONIC timerfd that any thread may re-arm
//! through a shared reference (`vmm_sys_util`'s `TimerFd` re-arms through `&mut self` only).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A one-shot CLOCK_MONOTONIC timerfd the timer thread sleeps on; any thread may re-arm it.
#[derive(Debug)]
pub(crate) struct TimerFd(OwnedFd);

impl TimerFd {
    pub(crate) fn new() -> std::io::Result<TimerFd> {
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Expire at `at` (at once if it passed), replacing any earlier setting and expiry.
    pub(crate) fn arm(&self, at: Instant) {
        // Never before `at`: the interval counts from a `now` taken before the call.
        let after = at.saturating_duration_since(Instant::now());
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the descriptor is a timerfd owned by `self`; `spec` is valid for the call.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Block until the timer expires.
    pub(crate) fn wait(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into `count`; the descriptor is owned by `self`.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}
