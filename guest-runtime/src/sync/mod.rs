//! Synchronisation, shaped like `std::sync`: [`Mutex`], [`Condvar`], [`RwLock`], [`Barrier`],
//! [`Once`], [`OnceLock`], [`LazyLock`], [`mpsc`], plus a counting [`Semaphore`]. Re-exports
//! `Arc` and the atomics.
//!
//! Blocking is the runtime's: a thread that must wait puts itself in the primitive's wait list
//! (an intrusive list through its TCB, under a short `SpinLock` that holds off preemption) and
//! parks; the scheduler runs something else on its vCPU. Nothing ever exits to the VMM.
//! Poisoning does not exist (a panic ends the guest) but the std signatures (`LockResult`) are
//! kept so code ports unchanged.

pub mod barrier;
pub mod condvar;
pub mod futex;
pub mod mpsc;
pub mod mutex;
pub mod once;
pub mod once_lock;
pub mod rwlock;
pub mod semaphore;
pub(crate) mod timed;
mod waitq;

pub use alloc::sync::{Arc, Weak};
pub use core::sync::atomic;

pub use barrier::{Barrier, BarrierWaitResult};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{Mutex, MutexGuard};
pub use once::{Once, OnceState};
pub use once_lock::{LazyLock, OnceLock};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};

use core::fmt;

/// std's poisoning error; never produced here (a panic ends the guest).
pub struct PoisonError<T> {
    guard: T,
}

impl<T> PoisonError<T> {
    pub fn new(guard: T) -> PoisonError<T> {
        PoisonError { guard }
    }

    pub fn into_inner(self) -> T {
        self.guard
    }

    pub fn get_ref(&self) -> &T {
        &self.guard
    }

    pub fn get_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> fmt::Debug for PoisonError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PoisonError")
    }
}

impl<T> fmt::Display for PoisonError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("poisoned lock: another task failed inside")
    }
}

impl<T> core::error::Error for PoisonError<T> {}

/// `std::sync::LockResult`.
pub type LockResult<G> = Result<G, PoisonError<G>>;

/// `std::sync::TryLockError`.
pub enum TryLockError<G> {
    Poisoned(PoisonError<G>),
    WouldBlock,
}

impl<G> fmt::Debug for TryLockError<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // std prints these as quoted strings; so do we.
        let name = match self {
            TryLockError::Poisoned(_) => "Poisoned(..)",
            TryLockError::WouldBlock => "WouldBlock",
        };
        fmt::Debug::fmt(name, f)
    }
}

impl<G> fmt::Display for TryLockError<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TryLockError::Poisoned(_) => "poisoned lock: another task failed inside",
            TryLockError::WouldBlock => "try_lock failed because the operation would block",
        })
    }
}

impl<G> core::error::Error for TryLockError<G> {}

impl<G> From<PoisonError<G>> for TryLockError<G> {
    fn from(e: PoisonError<G>) -> TryLockError<G> {
        TryLockError::Poisoned(e)
    }
}

/// `std::sync::TryLockResult`.
pub type TryLockResult<G> = Result<G, TryLockError<G>>;

/// Spins this many times on a contended lock before parking (only with more than one vCPU:
/// alone, the holder cannot run while we spin).
pub(crate) const SPIN_LIMIT: u32 = 7;

pub(crate) fn may_spin() -> bool {
    crate::percpu::nr_vcpus() > 1
}
