//! Thread control blocks: the block itself ([`Tcb`], `tcb/block.rs`, re-exported here) and
//! their pool.
//!
//! A [`Tcb`] is reference counted: the running thread holds one reference, its `JoinHandle`
//! one, every `Thread` handle one. When the count drops to zero the TCB goes back to a pool (per
//! vCPU, then global): TCBs are never freed, so a stale pointer can only ever point at a TCB.
//! The per-vCPU cache is in this vCPU's `Pcpu`, so the pool sits above `percpu.rs`, which holds
//! blocks in its run queues.

use alloc::boxed::Box;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use activm_stub::sync::SpinLock;

use crate::percpu;

pub mod block;

pub use block::*;

/// Every TCB ever allocated (diagnostics): a push-only list through `Tcb::all_next`.
static ALL: AtomicPtr<Tcb> = AtomicPtr::new(ptr::null_mut());

/// The address of the list's head (for the VMM's hang report, `crate::diag`).
pub fn all_head_address() -> u64 {
    &ALL as *const AtomicPtr<Tcb> as u64
}

/// Calls `f` on every TCB ever allocated.
pub fn for_each(mut f: impl FnMut(&'static Tcb)) {
    let mut p = ALL.load(Ordering::Acquire) as *const Tcb;
    while !p.is_null() {
        // SAFETY: TCBs are never freed.
        let t = unsafe { &*p };
        f(t);
        p = t.all_next.get();
    }
}
/// On a line of its own: every spawn writes it (false sharing with read-mostly words other
/// vCPUs poll cost a cache-line transfer per spawn).
static NEXT_ID: percpu::Line<AtomicU64> = percpu::Line(AtomicU64::new(1));
/// Global pool of free TCBs: an intrusive list through `Tcb::link` (no allocation under the
/// lock: a thread the VMM takes away may hold the heap lock, see `docs/runtime.md`).
struct Pool(*const Tcb);

// SAFETY: TCB pointers, used under the lock.
unsafe impl Send for Pool {}

static POOL: percpu::Line<SpinLock<Pool>> = percpu::Line(SpinLock::new(Pool(ptr::null())));

/// A fresh TCB with one reference per holder in `refs` and a new id.
pub fn alloc(refs: u32) -> &'static Tcb {
    let t = take_cached().unwrap_or_else(|| {
        let t: &'static Tcb = Box::leak(Box::new(Tcb::new()));
        let mut head = ALL.load(Ordering::Acquire);
        loop {
            t.all_next.set(head);
            match ALL.compare_exchange_weak(
                head,
                t as *const Tcb as *mut Tcb,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        t
    });
    t.id.set(NEXT_ID.fetch_add(1, Ordering::Relaxed));
    t.refs.store(refs, Ordering::Relaxed);
    t.wake.store(WOKEN, Ordering::Relaxed);
    t.token.store(TOKEN_EMPTY, Ordering::Relaxed);
    t.flags.store(0, Ordering::Relaxed);
    t.join.store(JOIN_RUNNING, Ordering::Relaxed);
    t.blocked_activation.store(0, Ordering::Relaxed);
    event(t, EV_SPAWNED);
    t
}

fn take_cached() -> Option<&'static Tcb> {
    // One atomic swap per entry, not a count changed in a separate step: a thread the VMM takes
    // here (a preemption hold does not stop it) is continued on another vCPU with this `p`
    // while this vCPU's next activation uses the same cache, and one TCB went to two spawns.
    let local = percpu::this().tcbs.iter().rev().find_map(|e| {
        if e.load(Ordering::Relaxed).is_null() {
            return None;
        }
        Some(e.swap(ptr::null_mut(), Ordering::Acquire)).filter(|raw| !raw.is_null())
    });
    let raw = match local {
        Some(raw) => raw as *const Tcb,
        None => {
            let mut pool = POOL.lock();
            let head = pool.0;
            if head.is_null() {
                return None;
            }
            // SAFETY: the pool holds only leaked, free TCBs; their link is the pool's.
            pool.0 = unsafe { &*head }.link.get();
            head
        }
    };
    // SAFETY: the pools hold only leaked, free TCBs.
    Some(unsafe { &*raw })
}

/// Drops one reference; the last one recycles the TCB.
pub fn release(t: &Tcb) {
    if t.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    recycle(t);
}

fn recycle(t: &Tcb) {
    if t.join.load(Ordering::Acquire) == JOIN_FINISHED {
        if let Some(drop_result) = t.drop_result.take() {
            // SAFETY: the thread finished and nobody took the result (join takes it and clears
            // `drop_result`).
            unsafe { drop_result(t.packet_ptr()) };
        }
    }
    t.free_packet();
    t.run.set(None);
    t.drop_result.set(None);
    // SAFETY: no reference to the TCB is left; nobody reads the name or the TLS slots.
    unsafe {
        *t.name.get() = None;
        (*t.tls.get()).clear();
    }
    debug_assert!(t.stack.get().is_none());
    // One atomic fill per entry (see `take_cached`).
    let raw = t as *const Tcb as *mut Tcb;
    let cached = percpu::this().tcbs.iter().any(|e| {
        e.load(Ordering::Relaxed).is_null()
            && e.compare_exchange(ptr::null_mut(), raw, Ordering::Release, Ordering::Relaxed)
                .is_ok()
    });
    if !cached {
        let mut pool = POOL.lock();
        t.link.set(pool.0);
        pool.0 = t;
    }
}
