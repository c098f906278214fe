//! Time, shaped like `std::time`: [`Instant`] (monotonic, from the TSC, which the VMM keeps in
//! step across vCPUs) and `Duration` (core's). There is no wall clock (`SystemTime`).

use core::fmt;
use core::ops::{Add, AddAssign, Sub, SubAssign};

pub use core::time::Duration;

use crate::arch::cpu;
use crate::timer;

/// A reading of the monotonic clock (`std::time::Instant`): nanoseconds since the guest booted.
/// Only differences mean anything. Never goes backwards, on any vCPU.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// Now.
    pub fn now() -> Instant {
        Instant(timer::ticks_to_ns(cpu::rdtsc()))
    }

    /// The time from `earlier` to `self`; zero if `earlier` is later (std saturates too).
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }

    /// The time from `earlier` to `self`, or `None` if `earlier` is later.
    pub fn checked_duration_since(&self, earlier: Instant) -> Option<Duration> {
        self.0.checked_sub(earlier.0).map(Duration::from_nanos)
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        self.checked_duration_since(earlier).unwrap_or_default()
    }

    /// The time since `self`.
    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(*self)
    }

    /// `self + d`, or `None` if that is past what an `Instant` can hold.
    pub fn checked_add(&self, d: Duration) -> Option<Instant> {
        let ns = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(ns).map(Instant)
    }

    /// `self - d`, or `None` if that is before what an `Instant` can hold (the boot).
    pub fn checked_sub(&self, d: Duration) -> Option<Instant> {
        let ns = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_sub(ns).map(Instant)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Panics on overflow, like std's.
    fn add(self, d: Duration) -> Instant {
        self.checked_add(d)
            .expect("overflow when adding duration to instant")
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Panics on overflow, like std's.
    fn sub(self, d: Duration) -> Instant {
        self.checked_sub(d)
            .expect("overflow when subtracting duration from instant")
    }
}

impl SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, d: Duration) {
        *self = *self - d;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero, like std's `duration_since`.
    fn sub(self, earlier: Instant) -> Duration {
        self.duration_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({} ns)", self.0)
    }
}
