//! Futexes at user level: `sys_futex_wait`/`sys_futex_wake` (std's Mutex, Condvar, RwLock,
//! Once, park and channels are built on them).
//!
//! Waiters sleep in one of [`BUCKETS`] lists chosen by address, each behind an activm-rt
//! `Mutex`. A waiter is a [`Waiter`] on its own stack, so a wake-up wakes exactly the threads
//! it takes off the list: an untimed waiter parks (activm-rt `park`/`unpark`, the cheapest
//! hand-over), a timed one waits on its own `Condvar` over the bucket's mutex (the runtime's
//! timer ends the wait). The value is compared under the bucket lock and every waker takes that
//! lock after changing the value, so no wake-up is lost. Nothing exits to the VMM.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use activm_rt::sync::{Condvar, Mutex};
use activm_rt::thread::{self, Thread};

use crate::errno::{fail, EAGAIN, EINVAL, ETIMEDOUT};
use crate::sys::Timespec;

/// hermit-abi's `FUTEX_RELATIVE_TIMEOUT`: the timeout is relative (std always passes it).
const FUTEX_RELATIVE_TIMEOUT: u32 = 1;
/// Number of wait lists (a power of two).
const BUCKETS: usize = 64;

/// One waiting thread, on its own stack while it is listed.
struct Waiter {
    addr: usize,
    /// Set (under the bucket lock) when a waker takes the waiter off the list.
    woken: AtomicBool,
    /// An untimed waiter parks: the thread to unpark. A timed one has none and waits on `wake`.
    parked: Option<Thread>,
    wake: Condvar,
}

/// A bucket's waiters, oldest first (raw pointers to `Waiter`s on their threads' stacks; a
/// waiter is listed only while its thread waits, and is removed under the bucket lock).
struct Bucket(alloc::vec::Vec<*const Waiter>);

// SAFETY: the pointers are only followed under the bucket's mutex, while their waiters wait.
unsafe impl Send for Bucket {}

static TABLE: [Mutex<Bucket>; BUCKETS] =
    [const { Mutex::new(Bucket(alloc::vec::Vec::new())) }; BUCKETS];

fn bucket(addr: usize) -> &'static Mutex<Bucket> {
    // Fibonacci hashing of the 4-byte-aligned address.
    let h = (addr >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 6);
    &TABLE[h % BUCKETS]
}

/// `int sys_futex_wait(u32 *address, u32 expected, const timespec *timeout, u32 flags)`: if
/// `*address == expected`, sleeps until `sys_futex_wake` on `address` or the (relative)
/// timeout. 0 when woken, `-EAGAIN` if the value differed, `-ETIMEDOUT`, `-EINVAL` for an
/// absolute or malformed timeout. May return 0 spuriously, like any futex.
///
/// # Safety
/// `address` points to a live `u32` used atomically; `timeout` is null or a `timespec`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_futex_wait(
    address: *mut u32,
    expected: u32,
    timeout: *const Timespec,
    flags: u32,
) -> i32 {
    if address.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller passes a readable timespec or null.
    let timeout = match unsafe { timeout.as_ref() } {
        None => None,
        Some(_) if flags & FUTEX_RELATIVE_TIMEOUT == 0 => return fail(EINVAL),
        Some(t) => match t.duration() {
            Some(d) => Some(d),
            None => return fail(EINVAL),
        },
    };
    // SAFETY: the caller's futex word, accessed atomically as std does.
    let word = unsafe { AtomicU32::from_ptr(address) };
    let addr = address as usize;
    let list = bucket(addr);
    let mut guard = list.lock().unwrap();
    if word.load(Ordering::SeqCst) != expected {
        return fail(EAGAIN);
    }
    let me = Waiter {
        addr,
        woken: AtomicBool::new(false),
        parked: timeout.is_none().then(thread::current),
        wake: Condvar::new(),
    };
    guard.0.push(&me);
    match timeout {
        None => {
            drop(guard);
            // A stale token (an unpark that came after an earlier wait ended) only makes
            // `park` return early: the flag decides.
            while !me.woken.load(Ordering::Acquire) {
                thread::park();
            }
            0
        }
        Some(d) => {
            let deadline = crate::sys::monotonic_ns().saturating_add(d.as_nanos() as u64);
            loop {
                let now = crate::sys::monotonic_ns();
                if me.woken.load(Ordering::Acquire) {
                    return 0;
                }
                if now >= deadline {
                    guard.0.retain(|&w| !ptr::eq(w, &me));
                    return fail(ETIMEDOUT);
                }
                let left = core::time::Duration::from_nanos(deadline - now);
                guard = me.wake.wait_timeout(guard, left).unwrap().0;
            }
        }
    }
}

/// `int sys_futex_wake(u32 *address, i32 count)`: wakes up to `count` waiters on `address`
/// (all of them if `count` is negative), oldest first; returns how many.
#[unsafe(no_mangle)]
pub extern "C" fn sys_futex_wake(address: *mut u32, count: i32) -> i32 {
    let addr = address as usize;
    let limit = if count < 0 {
        usize::MAX
    } else {
        count as usize
    };
    let mut woken = 0usize;
    let mut guard = bucket(addr).lock().unwrap();
    guard.0.retain(|&w| {
        // SAFETY: a listed waiter is alive: it leaves the list only under this lock.
        let w = unsafe { &*w };
        if woken < limit && w.addr == addr {
            woken += 1;
            match &w.parked {
                Some(t) => {
                    // Take a handle first: once the flag is set the waiter may return, and
                    // its `Waiter` (on its stack) is gone.
                    let t = t.clone();
                    w.woken.store(true, Ordering::Release);
                    t.unpark();
                }
                None => {
                    w.woken.store(true, Ordering::Release);
                    w.wake.notify_one();
                }
            }
            false
        } else {
            true
        }
    });
    woken as i32
}
