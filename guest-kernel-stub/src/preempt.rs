//! Preemption holds: the guest's equivalent of "interrupts off" for CPL3 code, which cannot mask
//! interrupts (and whose interrupt handlers may switch threads).
//!
//! Code that must not be preempted on this vCPU (a held spinlock, a short per-vCPU update)
//! holds a [`Hold`] guard (or, where the release happens on another path, brackets itself with
//! [`hold`] and [`release`]). Both are single instructions on this vCPU's counter, so a thread that migrates between vCPUs never changes another vCPU's
//! count. The layer above's interrupt handlers look at [`held`]: while it is non-zero they only
//! record what they wanted to do in this vCPU's pending word ([`defer`]) and return; the
//! [`release`] that brings the count back to zero sees the pending word and calls the hook the
//! layer above installed with [`set_release_hook`] (the thread runtime's safepoint). This is the
//! held-count half of the critical-section recovery of Williams 2002, section 6.

use core::sync::atomic::{AtomicPtr, Ordering};

use crate::arch::current::percpu::{
    gs_or, gs_read, hold_enter, hold_leave, HOLD_OFFSET, PENDING_OFFSET,
};

static RELEASE_HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
static WAIT_HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Installs a function a spinning lock waiter calls now and then (diagnostics: a watchdog).
pub fn set_wait_hook(hook: fn()) {
    WAIT_HOOK.store(hook as *mut (), Ordering::Release);
}

/// Called by lock waiters every so often.
#[cold]
#[inline(never)]
pub fn waiting() {
    let hook = WAIT_HOOK.load(Ordering::Acquire);
    if !hook.is_null() {
        // SAFETY: only `set_wait_hook` stores non-null values, all `fn()`.
        let hook = unsafe { core::mem::transmute::<*mut (), fn()>(hook) };
        hook();
    }
}

/// Installs the function [`release`] calls when the hold count drops to zero with pending work.
pub fn set_release_hook(hook: fn()) {
    RELEASE_HOOK.store(hook as *mut (), Ordering::Release);
}

/// Enters a region that must not be preempted on this vCPU. Prefer [`Hold`]; a bare `hold`
/// is for a region that ends on another path (its [`release`] is then documented there).
#[inline(always)]
pub fn hold() {
    hold_enter();
}

/// Leaves a region entered with [`hold`]; runs the release hook if that was the last hold and
/// an interrupt handler deferred work meanwhile.
#[inline(always)]
pub fn release() {
    // SAFETY: reads this vCPU's pending word.
    if hold_leave() && unsafe { gs_read(PENDING_OFFSET) } != 0 {
        release_slow();
    }
}

/// A preemption hold for as long as the guard lives ([`hold`] now, [`release`] when dropped).
/// Not `Send`: a held region never leaves its vCPU.
#[derive(Debug)]
#[must_use = "the hold ends when the guard is dropped"]
pub struct Hold(core::marker::PhantomData<*const ()>);

impl Hold {
    /// Enters a region that must not be preempted on this vCPU.
    #[inline(always)]
    pub fn new() -> Hold {
        hold();
        Hold(core::marker::PhantomData)
    }
}

impl Default for Hold {
    #[inline(always)]
    fn default() -> Hold {
        Hold::new()
    }
}

impl Drop for Hold {
    #[inline(always)]
    fn drop(&mut self) {
        release();
    }
}

#[cold]
#[inline(never)]
fn release_slow() {
    let hook = RELEASE_HOOK.load(Ordering::Acquire);
    if !hook.is_null() {
        // SAFETY: only `set_release_hook` stores non-null values, all `fn()`.
        let hook = unsafe { core::mem::transmute::<*mut (), fn()>(hook) };
        hook();
    }
}

/// For code that holds nothing and waits (a lock waiter): runs the release hook if an interrupt
/// handler deferred work meanwhile. Without this, a waiter that holds nothing could spin
/// forever on a lock whose holder only the deferred work (an upcall) would let finish.
#[inline(always)]
pub fn check_pending() {
    // SAFETY: reads this vCPU's pending word.
    if held() == 0 && unsafe { gs_read(PENDING_OFFSET) } != 0 {
        release_slow();
    }
}

/// This vCPU's hold count (non-zero: the interrupted code must not be preempted).
#[inline(always)]
pub fn held() -> u64 {
    // SAFETY: reads this vCPU's hold counter.
    unsafe { gs_read(HOLD_OFFSET) }
}

/// Records deferred work for the layer above in this vCPU's pending word.
#[inline(always)]
pub fn defer(bits: u64) {
    // SAFETY: one locked instruction on this vCPU's pending word.
    unsafe { gs_or(PENDING_OFFSET, bits) }
}
