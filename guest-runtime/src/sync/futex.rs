//! Futex-style waiting on a word's address ([`wait`], [`wake`]): what std's `sys_futex_wait` /
//! `sys_futex_wake` need (activm-std), at user level and without allocation. Waiters park in
//! one of [`BUCKETS`] intrusive wait lists chosen by address (tagged with it), each behind a
//! short spinlock; the value is compared under that lock, and a waker takes it after changing
//! the value, so no wake-up is lost. Untimed only: activm-std keeps timed waits on a condvar.

use core::sync::atomic::{AtomicU32, Ordering};

use activm_stub::sync::SpinLock;

use super::waitq::WaitList;
use crate::percpu::Line;
use crate::sched;

/// Number of wait lists (a power of two).
const BUCKETS: usize = 64;

static TABLE: [Line<SpinLock<WaitList>>; BUCKETS] =
    [const { Line(SpinLock::new(WaitList::new())) }; BUCKETS];

fn bucket(addr: usize) -> &'static SpinLock<WaitList> {
    // Fibonacci hashing of the 4-byte-aligned address.
    let h = (addr >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 6);
    &TABLE[h % BUCKETS].0
}

/// If `*word == expected`, parks the calling thread until [`wake`] on `word`'s address; false
/// (at once) if the value differed. Never returns early on its own.
pub fn wait(word: &AtomicU32, expected: u32) -> bool {
    let addr = word as *const AtomicU32 as usize;
    let me = sched::current();
    {
        let mut q = bucket(addr).lock();
        if word.load(Ordering::SeqCst) != expected {
            return false;
        }
        me.prepare_wait();
        q.push(me, addr);
    }
    sched::wait(me);
    true
}

/// Wakes up to `count` threads waiting on `addr` in [`wait`], oldest first; returns how many.
pub fn wake(addr: usize, count: usize) -> usize {
    if count == 0 {
        return 0;
    }
    let woken = bucket(addr).lock().take_tagged(addr, count);
    let n = woken.len();
    for t in woken {
        sched::wake(t);
    }
    n
}
