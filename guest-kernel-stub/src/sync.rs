//! [`SpinLock`]: a test-and-test-and-set lock that holds off preemption on this vCPU while it is
//! held ([`crate::preempt`]), so a thread is never switched out with a spinlock held and a lock
//! holder preempted by the VMM can be recognised and continued (Williams 2002, section 6).

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::preempt;

/// A spinlock for short critical sections; see the module documentation.
#[derive(Debug)]
pub struct SpinLock<T: ?Sized> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out one guard at a time; `T: Send` may move between threads.
unsafe impl<T: ?Sized + Send> Sync for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

impl<T: ?Sized> SpinLock<T> {
    /// Takes the lock, spinning at CPL3 while another vCPU holds it. The preemption hold is
    /// taken just before each attempt and dropped while waiting: a waiter holds nothing, so it
    /// can be preempted (and an upcall that must continue the preempted holder is not
    /// deferred behind it).
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        loop {
            let hold = preempt::Hold::new();
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return SpinGuard {
                    lock: self,
                    _hold: hold,
                };
            }
            drop(hold);
            let mut spins = 0u32;
            while self.locked.load(Ordering::Relaxed) {
                core::hint::spin_loop();
                preempt::check_pending();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1 << 16) {
                    preempt::waiting();
                }
            }
        }
    }

    /// Takes the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let hold = preempt::Hold::new();
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            Some(SpinGuard {
                lock: self,
                _hold: hold,
            })
        } else {
            None
        }
    }

    /// Whether someone holds the lock (a snapshot).
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }

    /// The value, through exclusive access to the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Proof of holding a [`SpinLock`]; releases it (and the preemption hold) on drop.
#[derive(Debug)]
pub struct SpinGuard<'a, T: ?Sized> {
    lock: &'a SpinLock<T>,
    /// Dropped after `drop` below unlocked: the hold ends once the lock is free.
    _hold: preempt::Hold,
}

impl<T: ?Sized> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T: ?Sized> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T: ?Sized> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
