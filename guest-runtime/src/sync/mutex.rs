//! [`Mutex`]: one atomic word (uncontended: a CAS to lock, a swap to unlock), spinning briefly
//! when contended on several vCPUs, then parking in a wait list (parking_lot's scheme: a
//! "parked" bit sends unlock to its slow path, which hands the wake-up to the oldest waiter).
//! In a guest with one vCPU the uncontended lock and unlock are compare-and-swaps without the
//! bus lock (`cpu::cas_one_vcpu`), as a uniprocessor kernel patches its `lock` prefixes out.

use core::cell::UnsafeCell;
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use super::{may_spin, LockResult, TryLockError, TryLockResult, SPIN_LIMIT};
use crate::arch::cpu;
use crate::{percpu, sched};

const LOCKED: u32 = 1;
const PARKED: u32 = 2;

/// The lock without data (used by `Mutex` and `Condvar`).
#[derive(Debug)]
pub(crate) struct RawMutex {
    state: AtomicU32,
    waiters: SpinLock<WaitList>,
}

impl RawMutex {
    pub const fn new() -> RawMutex {
        RawMutex {
            state: AtomicU32::new(0),
            waiters: SpinLock::new(WaitList::new()),
        }
    }

    #[inline]
    pub fn lock(&self) {
        let taken = if percpu::one_vcpu() {
            cpu::cas_one_vcpu(&self.state, 0, LOCKED)
        } else {
            self.state
                .compare_exchange_weak(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        };
        if !taken {
            self.lock_slow();
        }
    }

    #[inline]
    pub fn try_lock(&self) -> bool {
        let s = self.state.load(Ordering::Relaxed);
        s & LOCKED == 0
            && self
                .state
                .compare_exchange(s, s | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s & LOCKED == 0 {
                if self
                    .state
                    .compare_exchange_weak(s, s | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            if s & PARKED == 0 && spins < SPIN_LIMIT && may_spin() {
                // Exponential backoff: a waiter that reads the lock's line less often lets the
                // holder's vCPU run many critical sections between two transfers of the line.
                for _ in 0..1u32 << spins {
                    core::hint::spin_loop();
                }
                spins += 1;
                continue;
            }
            let me = sched::current();
            {
                let mut q = self.waiters.lock();
                let s = self.state.load(Ordering::Relaxed);
                if s & LOCKED == 0 {
                    continue;
                }
                if s & PARKED == 0
                    && self
                        .state
                        .compare_exchange(s, s | PARKED, Ordering::Relaxed, Ordering::Relaxed)
                        .is_err()
                {
                    continue;
                }
                me.prepare_wait();
                q.push(me, 0);
            }
            sched::wait(me);
            spins = 0;
        }
    }

    /// # Safety
    /// The caller holds the lock.
    #[inline]
    pub unsafe fn unlock(&self) {
        // With one vCPU: LOCKED to 0 without the bus lock; a PARKED bit makes it fail, and the
        // swap below releases the lock and wakes.
        if percpu::one_vcpu() && cpu::cas_one_vcpu(&self.state, LOCKED, 0) {
            return;
        }
        // One `xchg`, as NPTL's and std's futex mutexes do: a `lock cmpxchg` here measured
        // ~0.45 ns (10%) slower per lock + unlock on this machine. The lock is free at once;
        // the slow path only wakes a waiter.
        if self.state.swap(0, Ordering::Release) != LOCKED {
            self.unlock_slow();
        }
    }

    /// The lock was released with its PARKED bit set: wakes the oldest waiter, and sets the bit
    /// again if others still wait (a thread that took the lock meanwhile keeps it; its unlock
    /// then takes this path too). A waiter lists itself under the list lock only after it saw
    /// the lock held and the bit set, so it is either listed before this takes the list lock
    /// or it sees the lock free and retries: no wake-up is lost.
    #[cold]
    fn unlock_slow(&self) {
        let mut q = self.waiters.lock();
        let next = q.pop();
        if !q.is_empty() {
            self.state.fetch_or(PARKED, Ordering::Relaxed);
        }
        drop(q);
        if let Some(t) = next {
            sched::wake(t);
        }
    }
}

/// A mutual-exclusion lock protecting a `T` (`std::sync::Mutex`).
pub struct Mutex<T: ?Sized> {
    raw: RawMutex,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out one guard at a time; `T: Send` may move between threads.
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex {
            raw: RawMutex::new(),
            data: UnsafeCell::new(value),
        }
    }

    pub fn into_inner(self) -> LockResult<T> {
        Ok(self.data.into_inner())
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the lock, parking the thread while another holds it.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        self.raw.lock();
        Ok(MutexGuard { mutex: self })
    }

    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        if self.raw.try_lock() {
            Ok(MutexGuard { mutex: self })
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        Ok(self.data.get_mut())
    }

    pub fn is_poisoned(&self) -> bool {
        false
    }

    pub(crate) fn raw(&self) -> &RawMutex {
        &self.raw
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Mutex<T> {
        Mutex::new(T::default())
    }
}

impl<T: ?Sized> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex").finish_non_exhaustive()
    }
}

/// Holds a [`Mutex`]; unlocks it when dropped.
pub struct MutexGuard<'a, T: ?Sized> {
    mutex: &'a Mutex<T>,
}

// SAFETY: sharing a guard shares `&T`.
unsafe impl<T: ?Sized + Sync> Sync for MutexGuard<'_, T> {}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    pub(crate) fn mutex(&self) -> &'a Mutex<T> {
        self.mutex
    }

    /// # Safety
    /// The caller holds `mutex`'s lock.
    pub(crate) unsafe fn from_locked(mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        MutexGuard { mutex }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.mutex.data.get() }
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &mut *self.mutex.data.get() }
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard proves the lock is held.
        unsafe { self.mutex.raw.unlock() };
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
