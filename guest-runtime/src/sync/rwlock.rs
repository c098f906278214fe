//! [`RwLock`] (`std::sync::RwLock`): many readers or one writer, writers preferred (a reader
//! waits while a writer is queued). The state lives under a short `SpinLock`; waiters park and
//! retry when the holder leaves.

use core::cell::UnsafeCell;
use core::fmt;
use core::ops::{Deref, DerefMut};

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use super::{LockResult, TryLockError, TryLockResult};
use crate::sched;

const READER: usize = 0;
const WRITER: usize = 1;

#[derive(Debug)]
struct State {
    readers: u32,
    writer: bool,
    queued_writers: u32,
    queue: WaitList,
}

pub struct RwLock<T: ?Sized> {
    state: SpinLock<State>,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out shared guards only for `T: Sync` use and one exclusive guard.
unsafe impl<T: ?Sized + Send> Send for RwLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send + Sync> Sync for RwLock<T> {}

impl<T> RwLock<T> {
    pub const fn new(value: T) -> RwLock<T> {
        RwLock {
            state: SpinLock::new(State {
                readers: 0,
                writer: false,
                queued_writers: 0,
                queue: WaitList::new(),
            }),
            data: UnsafeCell::new(value),
        }
    }

    pub fn into_inner(self) -> LockResult<T> {
        Ok(self.data.into_inner())
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, waiting while a writer holds the lock or waits for it.
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        loop {
            let me = {
                let mut st = self.state.lock();
                if !st.writer && st.queued_writers == 0 {
                    st.readers += 1;
                    return Ok(RwLockReadGuard { lock: self });
                }
                let me = sched::current();
                me.prepare_wait();
                st.queue.push(me, READER);
                me
            };
            sched::wait(me);
        }
    }

    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        let mut st = self.state.lock();
        if !st.writer && st.queued_writers == 0 {
            st.readers += 1;
            Ok(RwLockReadGuard { lock: self })
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    /// Exclusive access.
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        loop {
            let me = {
                let mut st = self.state.lock();
                if !st.writer && st.readers == 0 {
                    st.writer = true;
                    return Ok(RwLockWriteGuard { lock: self });
                }
                let me = sched::current();
                me.prepare_wait();
                st.queue.push(me, WRITER);
                st.queued_writers += 1;
                me
            };
            sched::wait(me);
        }
    }

    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        let mut st = self.state.lock();
        if !st.writer && st.readers == 0 {
            st.writer = true;
            Ok(RwLockWriteGuard { lock: self })
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        Ok(self.data.get_mut())
    }

    /// Wakes every waiter (they retry); called with the state lock held, wakes after it.
    fn wake_all(&self, mut st: activm_stub::sync::SpinGuard<'_, State>) {
        let all = st.queue.take_all();
        st.queued_writers = 0;
        drop(st);
        for t in all {
            sched::wake(t);
        }
    }

    fn read_unlock(&self) {
        let mut st = self.state.lock();
        st.readers -= 1;
        if st.readers == 0 && !st.queue.is_empty() {
            self.wake_all(st);
        }
    }

    fn write_unlock(&self) {
        let mut st = self.state.lock();
        st.writer = false;
        if !st.queue.is_empty() {
            self.wake_all(st);
        }
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> RwLock<T> {
        RwLock::new(T::default())
    }
}

impl<T: ?Sized> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").finish_non_exhaustive()
    }
}

pub struct RwLockReadGuard<'a, T: ?Sized> {
    lock: &'a RwLock<T>,
}

// SAFETY: a read guard only gives `&T`.
unsafe impl<T: ?Sized + Sync> Sync for RwLockReadGuard<'_, T> {}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: readers hold the lock shared; no writer exists meanwhile.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.read_unlock();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

pub struct RwLockWriteGuard<'a, T: ?Sized> {
    lock: &'a RwLock<T>,
}

// SAFETY: sharing the guard shares `&T`.
unsafe impl<T: ?Sized + Sync> Sync for RwLockWriteGuard<'_, T> {}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer holds the lock exclusively.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the writer holds the lock exclusively.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<'a, T: ?Sized> RwLockWriteGuard<'a, T> {
    /// Turns the write lock into a read lock, atomically: no writer can get in between
    /// (`std::sync::RwLockWriteGuard::downgrade`). Waiting readers are let in too.
    pub fn downgrade(this: RwLockWriteGuard<'a, T>) -> RwLockReadGuard<'a, T> {
        let lock = this.lock;
        core::mem::forget(this);
        let mut st = lock.state.lock();
        st.writer = false;
        st.readers += 1;
        if st.queue.is_empty() {
            drop(st);
        } else {
            // They retry: readers get in (unless a writer queues first), writers wait again.
            lock.wake_all(st);
        }
        RwLockReadGuard { lock }
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.write_unlock();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
