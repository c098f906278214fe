//! The scheduler: per-vCPU run queues with work stealing (Go's `runtime/proc.go`: a fixed ring
//! per P, the owner pushes and pops, thieves take half) plus a global overflow queue; idle vCPUs
//! spin briefly, then mark themselves idle and `halt`; a reschedule IPI wakes one only when it
//! is really halted.
//!
//! **Contexts.** A vCPU runs either a thread (`Word::InSched` = 0, `Word::Current` = its TCB) or
//! the scheduler, on its activation's own stack (`Word::SchedTop`), entered by `switch_out`
//! ([`sched_entry`]) or by a new activation. The scheduler is never preempted on its vCPU:
//! interrupt handlers only record pending work (`preempt::defer`), which the loop checks.
//!
//! **Switch actions.** A thread leaves with an action the scheduler carries out once the thread
//! is completely saved (so nobody can resume a half-saved thread): requeue it (yield,
//! preemption), park it (CAS `WAITING` → `PARKED`, or requeue if a waker came first), or retire
//! it (exit: free the stack, tell the joiner, drop its reference).

use core::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

use activm_stub::protocol::arch::x86_64::VECTOR_RESCHEDULE;
use activm_stub::sync::SpinLock;
use activm_stub::{preempt, IrqFrame};

use crate::arch::context;
use crate::arch::cpu::{self, Word};
use crate::arch::rseq;
use crate::percpu::{self, RQ_CAP};
use crate::tcb::{self, Tcb};
use crate::{config, stack, start, timer, upcall};

/// Switch actions (`switch_out`'s second argument).
pub const ACT_YIELD: usize = 1;
pub const ACT_PREEMPTED: usize = 2;
pub const ACT_PARK: usize = 3;
pub const ACT_EXIT: usize = 4;

/// Bits of the stub's pending word: work an interrupt handler deferred.
pub const PEND_TIMER: u64 = 1 << 0;
pub const PEND_UPCALL: u64 = 1 << 1;
pub const PEND_RESCHED: u64 = 1 << 2;
/// A lock holder continued by the upcall handler: switch back at the last release.
pub const PEND_CONT: u64 = 1 << 3;

/// The idle vCPUs, on a line of their own (every spawn and wake-up reads it; idle vCPUs write
/// it): `spinning` looking for work, `halted` (or about to halt), a bit per vCPU.
pub struct IdleBits {
    pub spinning: AtomicU64,
    pub halted: AtomicU64,
}
pub static IDLE: percpu::Line<IdleBits> = percpu::Line(IdleBits {
    spinning: AtomicU64::new(0),
    halted: AtomicU64::new(0),
});
pub static SPINNING: &AtomicU64 = &IDLE.0.spinning;
pub static HALTED: &AtomicU64 = &IDLE.0.halted;

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

/// The thread running this code (null in scheduler context).
#[inline(always)]
pub fn current_raw() -> *const Tcb {
    cpu::get(Word::Current) as *const Tcb
}

/// The thread running this code. Panics in scheduler context.
#[inline(always)]
pub fn current() -> &'static Tcb {
    let raw = current_raw();
    assert!(!raw.is_null(), "not called from a thread");
    // SAFETY: `Word::Current` holds the running thread's TCB while a thread runs.
    unsafe { tcb::from_raw(raw) }
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
pub fn global_push(t: &Tcb) {
    tcb::event(t, tcb::EV_GLOBAL);
    global_push_list(t, t, 1);
}

/// Takes up to `max` threads from the global queue: the first is returned, the rest are pushed
/// on this vCPU's ring.
fn global_pop(max: usize) -> *const Tcb {
    if GLOBAL_LEN.load(Ordering::Acquire) == 0 {
        return core::ptr::null();
    }
    let mut batch: [*const Tcb; 32] = [core::ptr::null(); 32];
    let mut n = 0;
    {
        let mut g = GLOBAL.lock();
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
        timer::ensure_slice_timer();
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
            timer::ensure_slice_timer();
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
fn take_next() -> *const Tcb {
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
const NEXT_POLL_NS: u64 = 1_000;

/// The ring is full: move half of it and `t` to the global queue (Go's `runqputslow`).
#[cold]
fn overflow_to_global(t: &Tcb) {
    let mut batch = [core::ptr::null::<Tcb>(); RQ_CAP / 2];
    preempt::hold();
    let n = percpu::this().steal_half(&mut batch);
    preempt::release();
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

/// If vCPUs are halted and none is spinning, wakes one with a reschedule IPI (Go's `wakep`).
pub fn wake_idle_vcpu() {
    if start::nr_vcpus() == 1 {
        return;
    }
    fence(Ordering::SeqCst);
    wake_idle_vcpu_after_rmw();
}

/// [`wake_idle_vcpu`] after the work was published by a SeqCst read-modify-write (a full
/// barrier already: no fence needed).
fn wake_idle_vcpu_after_rmw() {
    if start::nr_vcpus() == 1 {
        return;
    }
    if SPINNING.load(Ordering::SeqCst) != 0 {
        return;
    }
    let me = 1u64 << activm_stub::vcpu_id();
    let halted = HALTED.load(Ordering::SeqCst) & !me;
    if halted == 0 {
        // Nobody here to wake: if vCPUs gave their processors back idle, ask for them again.
        upcall::want_processors();
        return;
    }
    let v = halted.trailing_zeros();
    let bit = 1u64 << v;
    if HALTED.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
        preempt::hold();
        cpu::send_ipi(percpu::of(v).apic_id, VECTOR_RESCHEDULE);
        percpu::bump(&percpu::this().counters.ipis_sent);
        preempt::release();
    }
}

/// `switch_out` wrapper: the current thread `me` leaves with `action`.
#[inline(always)]
fn switch_out(me: &Tcb, action: usize) {
    debug_assert_eq!(preempt::held(), 0);
    // SAFETY: `me` is the running thread (callers pass `current()`), this vCPU runs a thread and
    // nothing is held.
    unsafe { context::switch_out(me as *const Tcb as *mut u8, action, 0) }
}

/// Yields the processor to another runnable thread (if any; otherwise returns at once).
pub fn yield_current() {
    if !runnable_elsewhere() {
        return;
    }
    switch_out(current(), ACT_YIELD);
}

/// Puts the current thread at the back of the run queue (a preemption).
pub fn preempt_current() {
    let me = current();
    percpu::bump(&percpu::this().counters.preemptions);
    switch_out(me, ACT_PREEMPTED);
}

/// Parks `me` (the current thread, after `prepare_wait`) until `wake`.
pub fn park_current(me: &Tcb) {
    switch_out(me, ACT_PARK);
}

/// Parks `me` (after `prepare_wait`) and runs `t` (runnable, ours: taken off a queue) on this
/// vCPU at once, in its time slice: a joiner handing the processor to the thread it waits for.
/// Returns when `me` is woken and runs again. Nothing may wake `me` before `t` runs (its only
/// waker is `t`'s exit): the scheduler parks it without the usual race check.
pub fn park_and_run(me: &Tcb, t: &Tcb) {
    debug_assert_eq!(preempt::held(), 0);
    // SAFETY: as in `switch_out`; `t` is a runnable TCB nobody else may run (the caller took it
    // off a queue), handed to the scheduler entry as the switch argument.
    unsafe {
        context::switch_out(
            me as *const Tcb as *mut u8,
            ACT_PARK,
            t as *const Tcb as usize,
        )
    }
}

/// The current thread `me` is done: never returns.
pub fn exit_current(me: &Tcb) -> ! {
    switch_out(me, ACT_EXIT);
    percpu::print_trace_about(me as *const Tcb as u64);
    panic!("an exited thread was resumed: events {}", tcb::history(me));
}

/// Where `switch_out` lands, on this activation's stack, with `prev` fully saved.
pub extern "C" fn sched_entry(prev: *const Tcb, action: usize, arg: usize) -> ! {
    cpu::set(Word::Current, 0);
    // SAFETY: `switch_out` passes the TCB of the thread that just left.
    let prev = unsafe { tcb::from_raw(prev) };
    // A thread to hand the processor to (ours: runnable and in no queue), skipping the loop.
    let mut hand_to: *const Tcb = core::ptr::null();
    match action {
        ACT_YIELD | ACT_PREEMPTED => make_runnable(prev, false),
        ACT_PARK if arg != 0 => {
            // `park_and_run`: nothing can wake `prev` before `hand_to` runs, so no race with a
            // waker here (a plain store, not a locked compare-and-swap).
            hand_to = arg as *const Tcb;
            tcb::event(prev, tcb::EV_PARKED);
            debug_assert_eq!(prev.wake.load(Ordering::Relaxed), tcb::WAITING);
            prev.wake.store(tcb::PARKED, Ordering::Release);
        }
        ACT_PARK => {
            tcb::event(prev, tcb::EV_PARKED);
            if prev
                .wake
                .compare_exchange(
                    tcb::WAITING,
                    tcb::PARKED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                // Woken before it was parked.
                make_runnable(prev, false);
            }
        }
        ACT_EXIT => hand_to = crate::thread::retire(prev),
        _ => unreachable!("unknown switch action {action}"),
    }
    upcall::release_retired_stack();
    if action == ACT_PARK || action == ACT_EXIT {
        // A blocking switch: hand the processor over directly (the thread given, the joiner the
        // exit woke, or this vCPU's `next`) unless the loop has work of its own first.
        if loop_has_work() {
            if !hand_to.is_null() {
                // SAFETY: ours (see above); it runs first once the loop's work is done.
                make_next(unsafe { tcb::from_raw(hand_to) });
            }
        } else {
            let mut from = FROM_HAND;
            if hand_to.is_null() {
                hand_to = take_next();
                from = FROM_EXIT_NEXT;
            }
            if !hand_to.is_null() {
                // SAFETY: ours (see above, or just taken off `next`).
                run_now(unsafe { tcb::from_raw(hand_to) }, true, from);
            }
        }
    }
    sched_loop()
}

/// Whether the scheduler loop must run before any thread (deferred interrupt work, upcall
/// records or continuations, due sleepers): a direct hand-off must not skip it.
#[inline]
fn loop_has_work() -> bool {
    cpu::pending() != 0 || upcall::loop_work() || timer::sleepers_due()
}

/// The scheduler loop, on this activation's stack. Never returns: it switches to a thread.
pub fn sched_loop() -> ! {
    loop {
        cpu::set(Word::SchedIdle, 0);
        crate::stats::watchdog_tick();
        let pending = cpu::take_pending();
        upcall::drain();
        if pending & PEND_TIMER != 0 || timer::sleepers_due() {
            timer::wake_due();
        }
        let (t, inherit, from) = find_runnable();
        if !t.is_null() {
            // SAFETY: a runnable TCB taken off a queue: ours now.
            run_now(unsafe { tcb::from_raw(t) }, inherit, from);
        }
        idle();
    }
}

/// Finds a thread to run: sometimes the global queue first (fairness), then this vCPU's ring,
/// the global queue, and other vCPUs' rings (steal half).
/// The thread, whether it inherits the current time slice (it came from `next`), and where it
/// was taken from (`FROM_*`, diagnostics).
fn find_runnable() -> (*const Tcb, bool, u32) {
    let p = percpu::this();
    let tick = p.tick.load(Ordering::Relaxed);
    p.tick.store(tick.wrapping_add(1), Ordering::Relaxed);
    if tick % 61 == 60 {
        let t = global_pop(1);
        if !t.is_null() {
            return (t, false, FROM_GLOBAL_FAIR);
        }
    }
    let t = take_next();
    if !t.is_null() {
        return (t, true, FROM_NEXT);
    }
    let t = rseq::rq_pop();
    if !t.is_null() {
        let (head, tail) = (
            p.head.load(Ordering::Relaxed),
            p.tail.load(Ordering::Relaxed),
        );
        if tail.wrapping_sub(head) as usize > RQ_CAP {
            panic!(
                "this vCPU's run queue is corrupt after a pop: head {head}, tail {tail}; \
                 popped thread events {}",
                // SAFETY: a TCB from the ring (diagnostics).
                tcb::history(unsafe { tcb::from_raw(t) })
            );
        }
        return (t, false, FROM_RING);
    }
    let n = start::nr_vcpus() as usize;
    let t = global_pop(GLOBAL_LEN.load(Ordering::Relaxed) / n + 1);
    if !t.is_null() {
        return (t, false, FROM_GLOBAL);
    }
    let t = steal();
    if !t.is_null() {
        return (t, false, FROM_STEAL);
    }
    (steal_next(), false, FROM_STEAL_NEXT)
}

/// Where the scheduler took the thread it runs (`tcb::FROM_NAMES`).
pub const FROM_HAND: u32 = 1;
const FROM_EXIT_NEXT: u32 = 2;
const FROM_GLOBAL_FAIR: u32 = 3;
const FROM_NEXT: u32 = 4;
const FROM_RING: u32 = 5;
const FROM_GLOBAL: u32 = 6;
const FROM_STEAL: u32 = 7;
const FROM_STEAL_NEXT: u32 = 8;
pub const FROM_CONTINUED: u32 = 9;

fn steal() -> *const Tcb {
    let n = start::nr_vcpus();
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
    core::ptr::null()
}

/// Takes the `next` thread the idle loop saw staying on another vCPU beyond the grace period.
fn steal_next() -> *const Tcb {
    let p = percpu::this();
    if p.steal_next.swap(0, Ordering::Relaxed) == 0 {
        return core::ptr::null();
    }
    let t = p.seen_next.swap(core::ptr::null_mut(), Ordering::Relaxed);
    let v = p.seen_next_vcpu.load(Ordering::Relaxed);
    if t.is_null() || v >= start::nr_vcpus() {
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
/// does).
pub fn rescue_ring_of(vcpu: u32) {
    if vcpu == activm_stub::vcpu_id() || vcpu >= start::nr_vcpus() {
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
fn watch_next(now: u64) -> Option<bool> {
    let me = activm_stub::vcpu_id();
    let p = percpu::this();
    let mut busy = None;
    for v in 0..start::nr_vcpus() {
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
                >= timer::ns_to_ticks(NEXT_GRACE_NS)
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

/// Scheduler context: switches to `t` (binding a stack first if it never ran).
/// `inherit`: `t` came from `next` and runs in the current time slice.
pub fn run_now(t: &Tcb, inherit: bool, from: u32) -> ! {
    if t.stack.get().is_none() {
        let Some(s) = stack::alloc(t.stack_size.get()) else {
            panic!(
                "no memory for a {}-byte stack for thread {}",
                t.stack_size.get(),
                crate::thread::describe(t)
            );
        };
        t.stack.set(Some(s));
        // SAFETY: a fresh stack nobody uses; its top is 16-byte aligned.
        let sp = unsafe { context::build_start_frame(s.hi & !15, t as *const Tcb as *const u8) };
        // SAFETY: the thread does not run; its saved stack pointer is ours to set.
        unsafe { *t.sp.get() = sp };
    }
    // SAFETY: the thread does not run; its saved stack pointer is ours to read.
    let sp = unsafe { *t.sp.get() };
    match t.stack.get() {
        Some(s) if sp >= s.lo && sp < s.hi => {}
        s => {
            percpu::trace(percpu::T_BAD_SP, t as *const Tcb as u64);
            percpu::trace(percpu::T_BAD_SP, sp as u64);
            percpu::print_trace();
            panic!(
                "thread {} would resume with stack pointer {sp:#x} outside its stack {s:x?}; \
                 events {}",
                crate::thread::describe(t),
                tcb::history(t)
            );
        }
    }
    let p = percpu::this();
    let start = if inherit {
        p.slice_start.load(Ordering::Relaxed)
    } else {
        let now = cpu::rdtsc();
        p.slice_start.store(now, Ordering::Relaxed);
        now
    };
    tcb::event(t, tcb::EV_RUNNING | from << 8);
    t.slice_start.store(start, Ordering::Relaxed);
    percpu::bump(&p.counters.switches);
    timer::on_switch_in(start);
    percpu::trace(percpu::T_SWITCH_IN, t as *const Tcb as u64);
    // SAFETY: scheduler context; `t` is ours (popped), fully saved, with a valid frame.
    unsafe { context::switch_in(t as *const Tcb as *const u8) }
}

/// Whether anything could give this vCPU work (looks only; takes nothing).
fn work_visible() -> bool {
    cpu::pending() != 0 || work_queued()
}

/// [`work_visible`] but for deferred interrupt work.
pub(crate) fn work_queued() -> bool {
    if upcall::queue_nonempty() || timer::sleepers_due() {
        return true;
    }
    let p = percpu::this();
    if !p.is_empty()
        || !p.next.ptr.load(Ordering::SeqCst).is_null()
        || GLOBAL_LEN.load(Ordering::Acquire) != 0
    {
        return true;
    }
    let me = activm_stub::vcpu_id();
    (0..start::nr_vcpus()).any(|v| v != me && !percpu::of(v).is_empty())
}

/// Nothing to run: spin a while looking, then halt until an interrupt. Nothing is in flight
/// here (`Word::SchedIdle` = 1): a context the VMM takes in this function is simply dropped.
fn idle() {
    let me = activm_stub::vcpu_id();
    let bit = 1u64 << me;
    cpu::set(Word::SchedIdle, 1);
    SPINNING.fetch_or(bit, Ordering::AcqRel);
    let start = cpu::rdtsc();
    let spin = config::idle_spin_ticks();
    let mut spin_until = start + spin;
    // While another vCPU hands threads off through its `next` slot, keep spinning (up to this
    // long), ready to take one that stays there: halting would make its next spawn or wake-up
    // pay for a reschedule IPI (~13 us here).
    let spin_limit = start + 20 * spin;
    // Other vCPUs' `next` slots are looked at every `NEXT_POLL_NS` only: each look pulls the
    // line the owner writes at every hand-off.
    let poll = timer::ns_to_ticks(NEXT_POLL_NS);
    let mut next_poll = 0;
    loop {
        if work_visible() {
            SPINNING.fetch_and(!bit, Ordering::AcqRel);
            cpu::set(Word::SchedIdle, 0);
            return;
        }
        let now = cpu::rdtsc();
        if now >= next_poll {
            next_poll = now + poll;
            match watch_next(now) {
                Some(true) => {
                    SPINNING.fetch_and(!bit, Ordering::AcqRel);
                    cpu::set(Word::SchedIdle, 0);
                    return;
                }
                Some(false) => spin_until = spin_until.max((now + spin).min(spin_limit)),
                None => {}
            }
        }
        if now > spin_until {
            break;
        }
        crate::stats::watchdog_tick();
        for _ in 0..16 {
            core::hint::spin_loop();
        }
    }
    HALTED.fetch_or(bit, Ordering::SeqCst);
    SPINNING.fetch_and(!bit, Ordering::AcqRel);
    upcall::set_idle(me, true);
    if !work_visible() && watch_next(cpu::rdtsc()).is_none() {
        timer::arm_for_sleepers();
        // With activations, a vCPU idle for long enough gives its processor back (seed 001:
        // "this processor is idle"); the guest asks again when work needs it (see
        // `wake_idle_vcpu_after_rmw`). Not while threads sleep: a vCPU that halts arms the
        // timer for them, and the busy ones may not have.
        let yield_after = config::idle_yield_ticks();
        let may_yield = yield_after != 0
            && config::use_halt()
            && upcall::activations_enabled()
            && !timer::has_sleepers();
        let halted_at = cpu::rdtsc();
        if may_yield {
            timer::arm_idle_deadline(halted_at + yield_after);
        }
        percpu::bump(&percpu::this().counters.halts);
        if config::use_halt() {
            rseq::idle_halt();
        } else {
            let until = cpu::rdtsc() + config::idle_spin_ticks();
            while !work_visible() && cpu::rdtsc() < until {
                core::hint::spin_loop();
            }
        }
        // (The APIC timer may fire a little before the TSC says: 3/4 of the time is enough.)
        // The idle deadline's own tick leaves PEND_TIMER behind: with no thread and no
        // sleeper it has nothing to do (the next activation here finds it, harmlessly).
        if may_yield
            && cpu::rdtsc() >= halted_at + yield_after - yield_after / 4
            && cpu::pending() & !PEND_TIMER == 0
            && !work_queued()
            && watch_next(cpu::rdtsc()).is_none()
            && !timer::has_sleepers()
        {
            upcall::set_idle(me, false);
            HALTED.fetch_and(!bit, Ordering::AcqRel);
            // `SchedIdle` stays set until the yield: if the VMM takes the processor first, the
            // context it hands over must be dropped as an idle scheduler's, never adopted (an
            // adopter would run the `sa_yield` and give its own activation away).
            upcall::yield_idle_vcpu(me);
            // Returns only if the VMM kept the processor here (or the queue has records).
            cpu::set(Word::SchedIdle, 0);
            return;
        }
    }
    upcall::set_idle(me, false);
    HALTED.fetch_and(!bit, Ordering::AcqRel);
    cpu::set(Word::SchedIdle, 0);
}

/// Forgets vCPU `vcpu`'s idle bits (its activation is gone).
pub fn clear_idle_bits(vcpu: u32) {
    let bit = 1u64 << vcpu;
    SPINNING.fetch_and(!bit, Ordering::AcqRel);
    HALTED.fetch_and(!bit, Ordering::AcqRel);
    upcall::set_idle(vcpu, false);
}

/// Common start of the runtime's interrupt handlers: rewinds a restartable sequence the
/// interrupt landed in, then says whether the interrupted code is a thread that may be switched
/// away right now (not the scheduler, no preemption hold, not before the trampoline's EOI).
pub fn irq_prologue(frame: &mut IrqFrame) -> bool {
    if let Some(abort) = rseq::fixup(frame.rip) {
        frame.rip = abort;
        percpu::bump(&percpu::this().counters.rseq_rewinds);
    }
    if preempt::held() != 0 {
        percpu::bump(&percpu::this().counters.deferred_held);
        return false;
    }
    if cpu::get(Word::InSched) != 0 || current_raw().is_null() {
        percpu::bump(&percpu::this().counters.deferred_sched);
        return false;
    }
    if upcall::in_unsafe_window(frame.rip) {
        // Before the trampoline's EOI, or in an activation entry.
        return false;
    }
    // The frame must be on the current thread's stack. It is not when this interrupt nests in a
    // handler that interrupted an activation entry: that handler runs on the new activation's
    // stack while `Current` still names the previous activation's thread (whose context the
    // VMM may have handed to another vCPU). Switching "that thread" out here would file the
    // activation stack as its stack pointer.
    if on_current_thread_stack(frame as *const IrqFrame as usize) {
        true
    } else {
        percpu::trace(percpu::T_FOREIGN_STACK, frame.rip);
        percpu::bump(&percpu::this().counters.deferred_sched);
        false
    }
}

/// Whether `at` lies on the stack of the thread `Current` names (false without one).
fn on_current_thread_stack(at: usize) -> bool {
    let cur = current_raw();
    if cur.is_null() {
        return false;
    }
    // SAFETY: TCBs are never freed (pooled), and a thread's stack bounds change only while it
    // does not run.
    match unsafe { &*cur }.stack.get() {
        Some(s) => at >= s.lo && at < s.hi,
        None => false,
    }
}

/// The reschedule IPI: it only has to wake a halted vCPU (whose scheduler then looks for work).
pub fn on_resched(frame: &mut IrqFrame) {
    if irq_prologue(frame) {
        // A clean context: also act on anything a nested interrupt had to defer.
        safepoint();
    } else {
        preempt::defer(PEND_RESCHED);
    }
}

/// Called when the last preemption hold is released with work pending, and after `switch_in`
/// (thread context): carries out what interrupt handlers deferred.
pub fn safepoint() {
    if preempt::held() != 0 || cpu::get(Word::InSched) != 0 {
        return;
    }
    // An interrupt handler on top of a new activation's entry, before the entry reset the
    // words, sees the previous activation's: its hold count, its pending work and its thread
    // (which now runs elsewhere, or waits to). Nothing may be done for "that thread" there; the
    // entry clears what is pending.
    let here = 0u8;
    if !on_current_thread_stack(core::ptr::addr_of!(here) as usize) {
        return;
    }
    let pending = cpu::take_pending();
    if pending == 0 {
        return;
    }
    if pending & (PEND_UPCALL | PEND_CONT) != 0 {
        // Let the scheduler drain the upcall queue (or take back a continued lock holder).
        preempt_current();
        return;
    }
    if pending & PEND_TIMER != 0 {
        timer::tick_in_thread();
    }
}

/// `switch_in` calls this (C ABI) when work was pending at its commit.
pub extern "C" fn safepoint_from_switch() {
    safepoint();
}

/// Prints the scheduler's global state and every live thread's last event (diagnostics).
pub fn dump() {
    {
        tcb::for_each(|t| {
            let raw = t as *const Tcb as usize;
            if t.refs.load(Ordering::Relaxed) == 0 {
                return;
            }
            let ev = t.last_event.load(Ordering::Relaxed);
            activm_stub::println!(
                "activm-rt: thread #{} {:?} at {raw:#x}: {} on vCPU {}, wake {} join {:#x}",
                t.id.get(),
                t.name(),
                tcb::event_name(ev),
                ev & 0xff,
                t.wake.load(Ordering::Relaxed),
                t.join.load(Ordering::Relaxed),
            );
        });
    }
    activm_stub::println!(
        "activm-rt: global queue {} halted {:#x} spinning {:#x}",
        GLOBAL_LEN.load(Ordering::Relaxed),
        HALTED.load(Ordering::Relaxed),
        SPINNING.load(Ordering::Relaxed)
    );
}
