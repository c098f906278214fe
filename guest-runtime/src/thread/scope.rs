//! Scoped threads (`std::thread::scope`): threads that may borrow from the caller's stack,
//! because [`scope`] does not return before every thread spawned in it has finished and its
//! result is gone (taken by `join`, or dropped).
//!
//! Each scoped thread shares a [`Packet`] with its handle; the packet holds the result, and
//! when its last owner drops it (the thread after storing the result, or the handle after
//! taking it) it drops what is left and counts the thread out of the scope. The scope's owner
//! parks until the count is zero.

use alloc::sync::Arc;
use core::cell::UnsafeCell;
use core::fmt;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering};

use super::{current, park, Builder, JoinHandle, Result, Thread};
use crate::io;

/// What the scope's threads share with it.
struct ScopeData {
    /// Scoped threads whose packet is still alive.
    running: AtomicUsize,
    /// The thread that called [`scope`] (it waits for `running` to reach zero).
    owner: Thread,
}

impl ScopeData {
    fn thread_done(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.owner.unpark();
        }
    }
}

/// A scope to spawn threads in (`std::thread::Scope`).
pub struct Scope<'scope, 'env: 'scope> {
    data: Arc<ScopeData>,
    /// Invariant over 'scope, so a spawned thread cannot outlive it.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// Runs `f` with a scope; returns once every thread spawned in it has finished (joined or not).
/// A scoped thread that panics ends the guest (as every thread does here), so unlike std's this
/// never panics on behalf of a thread.
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    let scope = Scope {
        data: Arc::new(ScopeData {
            running: AtomicUsize::new(0),
            owner: current(),
        }),
        scope: PhantomData,
        env: PhantomData,
    };
    let result = f(&scope);
    while scope.data.running.load(Ordering::Acquire) != 0 {
        park();
    }
    result
}

impl<'scope> Scope<'scope, '_> {
    /// Spawns a thread that may borrow from outside the scope (`std::thread::Scope::spawn`).
    pub fn spawn<F, T>(&'scope self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        Builder::new().spawn_scoped(self, f).expect("spawn")
    }
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("running", &self.data.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Spawns a scoped thread with this configuration (`std::thread::Builder::spawn_scoped`).
    pub fn spawn_scoped<'scope, 'env, F, T>(
        self,
        scope: &'scope Scope<'scope, 'env>,
        f: F,
    ) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let packet = Arc::new(Packet {
            result: UnsafeCell::new(None),
            scope: scope.data.clone(),
        });
        let theirs = packet.clone();
        scope.data.running.fetch_add(1, Ordering::AcqRel);
        let body = move || {
            let result = f();
            // SAFETY: only this thread writes the result, before it drops its packet
            // reference; the handle reads it only after `join` saw the thread finish.
            unsafe { *theirs.result.get() = Some(result) };
            drop(theirs);
        };
        // SAFETY: `scope` waits until every packet is dropped, and the thread's closure (with
        // what it borrows) is consumed before it drops its packet reference; so nothing the
        // thread uses outlives 'scope.
        match unsafe { self.spawn_unchecked(body) } {
            Ok(handle) => Ok(ScopedJoinHandle {
                handle,
                packet,
                scope: PhantomData,
            }),
            Err(e) => {
                // No thread: the closure (and its packet reference) is gone already.
                drop(packet);
                Err(e)
            }
        }
    }
}

/// A scoped thread's result, shared by the thread and its handle.
struct Packet<T> {
    result: UnsafeCell<Option<T>>,
    scope: Arc<ScopeData>,
}

// SAFETY: the result is written by the thread and then read by the handle, ordered by the
// thread's exit and `join` (see `spawn_scoped`); `T: Send` may move between them.
unsafe impl<T: Send> Sync for Packet<T> {}

impl<T> Drop for Packet<T> {
    fn drop(&mut self) {
        // The result nobody joined goes first: it may borrow what the scope protects.
        drop(self.result.get_mut().take());
        self.scope.thread_done();
    }
}

/// An owned permission to join a scoped thread (`std::thread::ScopedJoinHandle`).
pub struct ScopedJoinHandle<'scope, T> {
    handle: JoinHandle<()>,
    packet: Arc<Packet<T>>,
    scope: PhantomData<&'scope ()>,
}

impl<T> ScopedJoinHandle<'_, T> {
    /// The thread.
    pub fn thread(&self) -> Thread {
        self.handle.thread()
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the thread to finish and returns its result.
    pub fn join(self) -> Result<T> {
        let ScopedJoinHandle { handle, packet, .. } = self;
        handle.join()?;
        // SAFETY: the thread finished, so it wrote the result and dropped its reference; only
        // this (consumed) handle touches the packet now.
        let result = unsafe { (*packet.result.get()).take() };
        Ok(result.expect("a finished scoped thread left its result"))
    }
}

impl<T> fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedJoinHandle")
            .field("thread", &self.handle.thread().id())
            .finish_non_exhaustive()
    }
}
