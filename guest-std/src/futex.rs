//! Futexes at user level: `sys_futex_wait`/`sys_futex_wake` (std's Mutex, Condvar, RwLock,
//! Once, park and channels are built on them).
//!
//! An untimed wait (the common case: every lock, condvar wait and park) is activm-rt's own
//! [`activm_rt::sync::futex`]: the thread parks in an intrusive wait list keyed by address,
//! nothing allocated and no reference counts touched. A timed wait sleeps in one of
//! [`BUCKETS`] lists chosen by address, each behind an activm-rt `Mutex`, as a [`Waiter`] on
//! its own stack waiting on its own `Condvar` over the bucket's mutex (the runtime's timer ends
//! the wait). In both, the value is compared under the list's lock and every waker takes that
//! lock after changing the value, so no wake-up is lost. A waker looks at the timed lists only
//! when their bucket has timed waiters ([`TIMED`], see [`sys_futex_wake`]). Nothing exits to
//! the VMM.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use activm_rt::sync::{futex, Condvar, Mutex};

use crate::errno::{fail, EAGAIN, EINVAL, ETIMEDOUT};
use crate::sys::Timespec;

/// hermit-abi's `FUTEX_RELATIVE_TIMEOUT`: the timeout is relative (std always passes it).
const FUTEX_RELATIVE_TIMEOUT: u32 = 1;
/// Number of wait lists (a power of two).
const BUCKETS: usize = 64;

/// One timed waiter, on its own stack while it is listed.
struct Waiter {
    addr: usize,
    /// Set (under the bucket lock) when a waker takes the waiter off the list.
    woken: AtomicBool,
    wake: Condvar,
}

/// A bucket's waiters, oldest first (raw pointers to `Waiter`s on their threads' stacks; a
/// waiter is listed only while its thread waits, and is removed under the bucket lock).
struct Bucket(alloc::vec::Vec<*const Waiter>);

// SAFETY: the pointers are only followed under the bucket's mutex, while their waiters wait.
unsafe impl Send for Bucket {}

static TABLE: [Mutex<Bucket>; BUCKETS] =
    [const { Mutex::new(Bucket(alloc::vec::Vec::new())) }; BUCKETS];

/// Timed waiters per bucket (changed under the bucket's lock, read by wakers).
static TIMED: [AtomicU32; BUCKETS] = [const { AtomicU32::new(0) }; BUCKETS];

fn bucket_index(addr: usize) -> usize {
    // Fibonacci hashing of the 4-byte-aligned address.
    ((addr >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 6)) % BUCKETS
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
    let Some(d) = timeout else {
        return if futex::wait(word, expected) {
            0
        } else {
            fail(EAGAIN)
        };
    };
    let addr = address as usize;
    let b = bucket_index(addr);
    let mut guard = TABLE[b].lock().unwrap();
    // Counted before the value is read: a waker that changed the value earlier is seen below;
    // one that changes it later sees the count (both are read-modify-writes of `TIMED[b]`,
    // see `sys_futex_wake`).
    TIMED[b].fetch_add(1, Ordering::SeqCst);
    if word.load(Ordering::SeqCst) != expected {
        TIMED[b].fetch_sub(1, Ordering::Relaxed);
        return fail(EAGAIN);
    }
    let me = Waiter {
        addr,
        woken: AtomicBool::new(false),
        wake: Condvar::new(),
    };
    guard.0.push(&me);
    let deadline = crate::sys::monotonic_ns().saturating_add(d.as_nanos() as u64);
    let result = loop {
        let now = crate::sys::monotonic_ns();
        if me.woken.load(Ordering::Acquire) {
            break 0;
        }
        if now >= deadline {
            guard.0.retain(|&w| !ptr::eq(w, &me));
            break fail(ETIMEDOUT);
        }
        let left = core::time::Duration::from_nanos(deadline - now);
        guard = me.wake.wait_timeout(guard, left).unwrap().0;
    };
    TIMED[b].fetch_sub(1, Ordering::Relaxed);
    result
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
    let mut woken = futex::wake(addr, limit);
    let b = bucket_index(addr);
    // A read-modify-write, not a load: ordered with a timed waiter's increment, so either this
    // sees it, or that waiter's later read of the value sees the change made before this call.
    if woken >= limit || TIMED[b].fetch_add(0, Ordering::SeqCst) == 0 {
        return woken as i32;
    }
    let mut guard = TABLE[b].lock().unwrap();
    guard.0.retain(|&w| {
        // SAFETY: a listed waiter is alive: it leaves the list only under this lock.
        let w = unsafe { &*w };
        if woken < limit && w.addr == addr {
            woken += 1;
            w.woken.store(true, Ordering::Release);
            w.wake.notify_one();
            false
        } else {
            true
        }
    });
    woken as i32
}
