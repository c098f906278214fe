//! The run queues: a ring per vCPU (pushed and popped by restartable sequences), its `next`
//! slot for direct hand-offs, the global overflow queue, and work stealing.

use core::sync::atomic::{AtomicUsize, Ordering};

use activm_stub::preempt;
use activm_stub::sync::SpinLock;

use super::slice::ensure_slice_timer;
use super::wakeup::{wake_idle_vcpu, wake_idle_vcpu_after_rmw};
use crate::arch::cpu::{self, Word};
use crate::arch::rseq;
use crate::percpu::{self, RQ_CAP};
use crate::tcb::{self, Tcb};

/// The global run queue: an intrusive FIFO through `Tcb::link`.
struct GlobalQueue {
    head: *const Tcb,
    tail: *const Tcb,
}

// SAFETY: the raw pointers are TCBs (never freed), accessed under the lock.
unsafe impl Send for GlobalQueue {}

/// The global queue's lock and length share a line (written together), away from read-mostly
/// words.
static GLOBAL: percpu::Line<SpinLock<GlobalQueue>> = percpu::Line(SpinLock::new(GlobalQueue {
    head: core::ptr::null(),
    tail: core::ptr::null(),
}));
static GLOBAL_LEN: percpu::Line<AtomicUsize> = percpu::Line(AtomicUsize::new(0));

/// The address of the global queue's length (diagnostics).
pub(super) fn global_len_address() -> u64 {
    &GLOBAL_LEN.0 as *const AtomicUsize as u64
}

fn global_push_list(first: *const Tcb, last: *const Tcb, n: usize) {
    let mut g = GLOBAL.lock();
    // SAFETY: `last` is a TCB being queued; its link is ours until it is popped.
    unsafe { tcb::from_raw(last) }.link.set(core::ptr::null());
    if g.tail.is_null() {
        g.head = first;
    } else {
        // SAFETY: the tail is a queued TCB; its link belongs to the queue (we hold the lock).
        unsafe { tcb::from_raw(g.tail) }.link.set(first);
    }
    g.tail = last;
    GLOBAL_LEN.fetch_add(n, Ordering::Release);
}

/// Puts `t` on the global run queue.
fn global_push(t: &Tcb) {
    tcb::event(t, tcb::EV_GLOBAL);
    global_push_list(t, t, 1);
}

/// Takes up to `max` threads from the global queue: the first is returned, the rest are pushed
/// on this vCPU's ring. A scheduler's: none if the queue's lock is taken (its holder may be a
/// scheduler context queued for adoption behind this one; the loop comes back through its top,
/// which adopts, while `global_len` says work waits).
fn global_pop(max: usize) -> *const Tcb {
    if GLOBAL_LEN.load(Ordering::Acquire) == 0 {
        return core::ptr::null();
    }
    let mut batch: [*const Tcb; 32] = [core::ptr::null(); 32];
    let mut n = 0;
    {
        let Some(mut g) = GLOBAL.try_lock() else {
            return core::ptr::null();
        };
        while n < max.min(batch.len()) && !g.head.is_null() {
            let t = g.head;
            // SAFETY: queued TCB; its link belongs to the queue.
            g.head = unsafe { tcb::from_raw(t) }.link.get();
            if g.head.is_null() {
                g.tail = core::ptr::null();
            }
            batch[n] = t;
            n += 1;
        }
        GLOBAL_LEN.fetch_sub(n, Ordering::Release);
    }
    for &t in batch.iter().take(n).skip(1) {
        // SAFETY: runnable TCBs just taken off the global queue.
        if !unsafe { rseq::rq_push(t) } {
            // SAFETY: as above.
            global_push(unsafe { tcb::from_raw(t) });
        }
    }
    batch[0]
}

/// Makes `t` runnable on this vCPU (its ring, or the global queue if the ring is full).
/// `wake_others`: new work appeared (spawn, wake-up), so an idle vCPU may be woken for it.
pub fn make_runnable(t: &Tcb, wake_others: bool) {
    tcb::event(t, tcb::EV_QUEUED);
    // SAFETY: `t` is runnable and in no queue (its owner gives it up here).
    if !unsafe { rseq::rq_push(t) } {
        overflow_to_global(t);
    }
    if cpu::get(Word::InSched) == 0 {
        ensure_slice_timer();
    }
    if wake_others {
        wake_idle_vcpu();
    }
}

/// A thread the running thread just spawned or woke (thread context): it runs next on this
/// vCPU, when the running thread blocks or yields (Go's `runnext`). A thread it displaces there
/// goes to the ring. Idle vCPUs take it only after [`NEXT_GRACE_NS`]: a thread spawned or woken
/// here is usually the one the running thread is about to wait for, and running it here, at
/// once, is a hand-off that moves no cache lines.
pub fn make_next(t: &Tcb) {
    tcb::event(t, tcb::EV_NEXT);
    // SeqCst: the swap publishes the work before `wake_idle_vcpu` reads `HALTED` (the idle
    // side sets `HALTED`, then looks at `next`; see `idle`).
    let slot = &percpu::this().next;
    // Only this vCPU's threads fill its slot (a thread moved to another vCPU right here would
    // fill the old one's: still correct, the count is only a hint for idle vCPUs).
    slot.seq.store(
        slot.seq.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
    let old = slot.ptr.swap(t as *const Tcb as *mut Tcb, Ordering::SeqCst);
    if old.is_null() {
        if cpu::get(Word::InSched) == 0 {
            ensure_slice_timer();
        }
        wake_idle_vcpu_after_rmw();
    } else {
        // SAFETY: a runnable TCB that was in `next`: ours now that we swapped it out.
        make_runnable(unsafe { tcb::from_raw(old) }, true);
    }
}

/// Takes this vCPU's `next` thread if it is `t` (a joiner about to wait for `t`).
pub fn take_next_if(t: &Tcb) -> bool {
    percpu::this()
        .next
        .ptr
        .compare_exchange(
            t as *const Tcb as *mut Tcb,
            core::ptr::null_mut(),
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_ok()
}

/// Takes this vCPU's `next` thread (scheduler context), or null.
pub(crate) fn take_next() -> *const Tcb {
    let next = &percpu::this().next.ptr;
    if next.load(Ordering::Relaxed).is_null() {
        return core::ptr::null();
    }
    next.swap(core::ptr::null_mut(), Ordering::Acquire)
}

/// How long another vCPU's `next` thread must stay there before an idle vCPU takes it (Go waits
/// 3 us): the running thread there is probably about to block and run it itself.
pub const NEXT_GRACE_NS: u64 = 4_000;
/// How often an idle vCPU looks at the other vCPUs' `next` slots.
pub(crate) const NEXT_POLL_NS: u64 = 1_000;

/// The ring is full: move half of it and `t` to the global queue (Go's `runqputslow`).
#[cold]
fn overflow_to_global(t: &Tcb) {
    let mut batch = [core::ptr::null::<Tcb>(); RQ_CAP / 2];
    let hold = preempt::Hold::new();
    let n = percpu::this().steal_half(&mut batch);
    drop(hold);
    for i in 0..n {
        // SAFETY: runnable TCBs taken off our ring.
        let b = unsafe { tcb::from_raw(batch[i]) };
        b.link.set(if i + 1 < n {
            batch[i + 1]
        } else {
            core::ptr::null()
        });
    }
    if n > 0 {
        global_push_list(batch[0], batch[n - 1], n);
    }
    global_push(t);
}

/// Whether another thread is waiting for this vCPU (its ring or the global queue).
pub fn runnable_elsewhere() -> bool {
    let p = percpu::this();
    !p.is_empty()
        || !p.next.ptr.load(Ordering::Relaxed).is_null()
        || GLOBAL_LEN.load(Ordering::Relaxed) != 0
}

/// Finds a thread to run: sometimes the global queue first (fairness), then this vCPU's ring,
/// the global queue, and other vCPUs' rings (steal half).
/// The thread, and whether it inherits the current time slice (it came from `next`).
pub(crate) fn find_runnable() -> (*const Tcb, bool) {
    let p = percpu::this();
    let tick = p.tick.load(Ordering::Relaxed);
    p.tick.store(tick.wrapping_add(1), Ordering::Relaxed);
    if tick % 61 == 60 {
        let t = global_pop(1);
        if !t.is_null() {
            return (t, false);
        }
    }
    let t = take_next();
    if !t.is_null() {
        return (t, true);
    }
    let t = rseq::rq_pop();
    if !t.is_null() {
        return (t, false);
    }
    let n = percpu::nr_vcpus() as usize;
    let t = global_pop(GLOBAL_LEN.load(Ordering::Relaxed) / n + 1);
    if !t.is_null() {
        return (t, false);
    }
    (steal(), false)
}

fn steal() -> *const Tcb {
    let n = percpu::nr_vcpus();
    if n == 1 {
        return core::ptr::null();
    }
    let me = activm_stub::vcpu_id();
    let first = (percpu::this().random() % u64::from(n)) as u32;
    let mut batch = [core::ptr::null::<Tcb>(); RQ_CAP / 2];
    for i in 0..n {
        let v = (first + i) % n;
        if v == me {
            continue;
        }
        let got = percpu::of(v).steal_half(&mut batch);
        if got == 0 {
            continue;
        }
        percpu::bump(&percpu::this().counters.steals);
        for &t in batch.iter().take(got).skip(1) {
            // SAFETY: runnable TCBs we just took.
            if !unsafe { rseq::rq_push(t) } {
                // SAFETY: as above.
                global_push(unsafe { tcb::from_raw(t) });
            }
        }
        return batch[0];
    }
    steal_next()
}

/// Takes the `next` thread the idle loop saw staying on another vCPU beyond the grace period.
fn steal_next() -> *const Tcb {
    let p = percpu::this();
    if p.steal_next.swap(0, Ordering::Relaxed) == 0 {
        return core::ptr::null();
    }
    let t = p.seen_next.swap(core::ptr::null_mut(), Ordering::Relaxed);
    let v = p.seen_next_vcpu.load(Ordering::Relaxed);
    if t.is_null() || v >= percpu::nr_vcpus() {
        return core::ptr::null();
    }
    // If another thread took its place meanwhile, nothing is taken (the idle loop looks again).
    if percpu::of(v)
        .next
        .ptr
        .compare_exchange(
            t,
            core::ptr::null_mut(),
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        percpu::bump(&percpu::this().counters.steals);
        return t;
    }
    core::ptr::null()
}

/// Moves the threads queued on `vcpu`'s ring (and its `next` slot) to this vCPU's: `vcpu` lost
/// its activation (PREEMPTED, BLOCKED), and while the vCPUs that run are busy nobody would
/// steal them, so they would wait until `vcpu` runs again. Safe in the upcall handler: stealing
/// is lock-free (only a full ring of ours spills into the global queue, as `make_runnable`
/// does). "Ours" is whichever vCPU runs this when it pushes (`rq_push` finds it afresh).
pub fn rescue_ring_of(vcpu: u32) {
    if vcpu == activm_stub::vcpu_id() || vcpu >= percpu::nr_vcpus() {
        return;
    }
    let next = percpu::of(vcpu)
        .next
        .ptr
        .swap(core::ptr::null_mut(), Ordering::Acquire);
    if !next.is_null() {
        percpu::bump(&percpu::this().counters.steals);
        // SAFETY: a runnable TCB we just took off that vCPU's `next` slot.
        if !unsafe { rseq::rq_push(next) } {
            // SAFETY: as above.
            global_push(unsafe { tcb::from_raw(next) });
        }
    }
    let mut batch = [core::ptr::null::<Tcb>(); RQ_CAP / 2];
    loop {
        // This may be a scheduler context taken away mid-drain and adopted on another vCPU
        // since the check above, perhaps on `vcpu` itself: its ring is then ours, and moving it
        // onto itself half by half would never end (a guest's scheduler spun here for good).
        if vcpu == activm_stub::vcpu_id() {
            return;
        }
        let got = percpu::of(vcpu).steal_half(&mut batch);
        if got == 0 {
            return;
        }
        percpu::bump(&percpu::this().counters.steals);
        for &t in batch.iter().take(got) {
            // SAFETY: runnable TCBs we just took off that ring.
            if !unsafe { rseq::rq_push(t) } {
                // SAFETY: as above.
                global_push(unsafe { tcb::from_raw(t) });
            }
        }
    }
}

/// Idle loop: looks at the other vCPUs' `next` threads. Returns `Some(true)` when one stayed
/// beyond the grace period (`steal_next` will try to take it), `Some(false)` when one is there
/// (the vCPU is busy handing off: keep spinning), `None` when there is none.
pub(crate) fn watch_next(now: u64) -> Option<bool> {
    let me = activm_stub::vcpu_id();
    let p = percpu::this();
    let mut busy = None;
    for v in 0..percpu::nr_vcpus() {
        if v == me {
            continue;
        }
        let slot = &percpu::of(v).next;
        let t = slot.ptr.load(Ordering::SeqCst);
        if t.is_null() {
            continue;
        }
        let seq = slot.seq.load(Ordering::Relaxed);
        if p.seen_next.load(Ordering::Relaxed) == t
            && p.seen_next_vcpu.load(Ordering::Relaxed) == v
            && p.seen_next_seq.load(Ordering::Relaxed) == seq
        {
            if now.saturating_sub(p.seen_next_at.load(Ordering::Relaxed))
                >= percpu::ns_to_ticks(NEXT_GRACE_NS)
            {
                p.steal_next.store(1, Ordering::Relaxed);
                return Some(true);
            }
        } else {
            p.seen_next_vcpu.store(v, Ordering::Relaxed);
            p.seen_next.store(t, Ordering::Relaxed);
            p.seen_next_at.store(now, Ordering::Relaxed);
            p.seen_next_seq.store(seq, Ordering::Relaxed);
        }
        busy = Some(false);
    }
    busy
}

/// Threads in the global queue.
pub(crate) fn global_len() -> usize {
    GLOBAL_LEN.load(Ordering::Acquire)
}
