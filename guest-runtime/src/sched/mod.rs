//! The scheduler core: per-vCPU run queues with work stealing (Go's `runtime/proc.go`: a fixed
//! ring per P, the owner pushes and pops, thieves take half) plus a global overflow queue, the
//! current thread, wait and wake, and switching. It knows nothing of devices, sleepers or
//! upcalls: the scheduler loop that polls those and idles (`dispatch`) is its caller. A
//! reschedule IPI wakes an idle vCPU only when it is really halted (`wakeup`).
//!
//! **Contexts.** A vCPU runs either a thread (`Word::InSched` = 0, `Word::Current` = its TCB) or
//! the scheduler, on its activation's own stack (`Word::SchedTop`), entered by `switch_out`
//! (`dispatch`'s landing, then [`finish_switch`]) or by a new activation ([`enter_loop`]). The
//! scheduler is never preempted on its vCPU: interrupt handlers only record pending work
//! (`preempt::defer`), which the loop checks.
//!
//! **Switch actions.** A thread leaves with an action the scheduler carries out once the thread
//! is completely saved (so nobody can resume a half-saved thread): requeue it (yield,
//! preemption), park it (CAS `WAITING` → `PARKED`, or requeue if a waker came first), or retire
//! it (exit: free the stack, tell the joiner, drop its reference).
//!
//! **Files.** This one: switching (out, in, the switch actions); `queue`: the run queues and
//! work stealing; `wakeup`: idle vCPUs' bits and waking one; `slice`: the time-slice timer;
//! `irq`: the interrupt handlers' common prologue.

use core::sync::atomic::{AtomicPtr, Ordering};

use activm_stub::preempt;
use activm_stub::protocol::timeline::SwitchReason;

use crate::arch::context;
use crate::arch::cpu::{self, Word};
use crate::tcb::{self, Tcb};
use crate::{exception_stack, percpu, stack, timeline};

mod irq;
mod queue;
mod slice;
mod wakeup;

pub use irq::{in_unsafe_window, irq_prologue, on_current_thread_stack};
pub(crate) use queue::{find_runnable, global_len, take_next, watch_next, NEXT_POLL_NS};
pub use queue::{make_next, make_runnable, rescue_ring_of, runnable_elsewhere, take_next_if};
pub(crate) use slice::wanted_deadline;
pub use wakeup::clear_idle_bits;
pub(crate) use wakeup::{halt_ended, runs_soon_here, turn_ended, HALTED, SPINNING};

/// What a thread leaving the processor wants done with it, once it is completely saved
/// (`switch_out`'s second argument, passed through the switch as a number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Switch {
    /// Back to the run queue (a yield).
    Yield = 1,
    /// Back to the run queue (a preemption).
    Preempted = 2,
    /// Parked until woken (or handed the processor to the switch's argument).
    Park = 3,
    /// Retired: the thread exited.
    Exit = 4,
}

impl Switch {
    fn from_raw(raw: usize) -> Switch {
        match raw {
            1 => Switch::Yield,
            2 => Switch::Preempted,
            3 => Switch::Park,
            4 => Switch::Exit,
            _ => unreachable!("unknown switch action {raw}"),
        }
    }

    /// As the trace's timeline says it.
    fn reason(self) -> SwitchReason {
        match self {
            Switch::Yield => SwitchReason::Yield,
            Switch::Preempted => SwitchReason::Preempted,
            Switch::Park => SwitchReason::Park,
            Switch::Exit => SwitchReason::Exit,
        }
    }
}

/// Work an interrupt handler deferred: bits of the stub's pending word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Pending {
    /// The time-slice (or sleepers') timer fired.
    Timer = 1 << 0,
    /// Upcall records wait in this vCPU's queue.
    Upcall = 1 << 1,
    /// A reschedule IPI came.
    Resched = 1 << 2,
    /// A lock holder continued by the upcall handler: switch back at the last release.
    Cont = 1 << 3,
}

impl Pending {
    /// Its bit in the pending word.
    #[inline(always)]
    pub const fn bit(self) -> u64 {
        self as u64
    }

    /// Whether the pending word `word` holds it.
    #[inline(always)]
    pub const fn is_in(self, word: u64) -> bool {
        word & self.bit() != 0
    }

    /// Records it in this vCPU's pending word, for the safepoint or the scheduler loop.
    #[inline]
    pub fn defer(self) {
        preempt::defer(self.bit());
    }
}

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

/// `switch_out` wrapper: the current thread `me` leaves with `action`.
#[inline(always)]
fn switch_out(me: &Tcb, action: Switch) {
    debug_assert_eq!(preempt::held(), 0);
    // SAFETY: `me` is the running thread (callers pass `current()`), this vCPU runs a thread and
    // nothing is held.
    unsafe { context::switch_out(me as *const Tcb as *mut u8, action as usize, 0) }
}

/// Yields the processor to another runnable thread (if any; otherwise returns at once).
pub fn yield_current() {
    if !runnable_elsewhere() {
        return;
    }
    switch_out(current(), Switch::Yield);
}

/// Yields through the scheduler loop even when no other thread is runnable: its top takes what
/// the VMM left for it (I/O completions, socket readiness), which may wake another thread.
pub fn yield_through_loop() {
    switch_out(current(), Switch::Yield);
}

/// Puts the current thread at the back of the run queue (a preemption).
pub fn preempt_current() {
    let me = current();
    percpu::bump(&percpu::this().counters.preemptions);
    switch_out(me, Switch::Preempted);
}

/// Parks `me` (the current thread, after `prepare_wait`) until `wake`.
pub fn park_current(me: &Tcb) {
    switch_out(me, Switch::Park);
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
            Switch::Park as usize,
            t as *const Tcb as usize,
        )
    }
}

/// The current thread `me` is done: never returns.
pub fn exit_current(me: &Tcb) -> ! {
    switch_out(me, Switch::Exit);
    percpu::print_trace_about(me as *const Tcb as u64);
    panic!("an exited thread was resumed: events {}", tcb::history(me));
}

/// Scheduler side of a switch (`dispatch`'s landing after `switch_out` calls it first): the
/// thread `prev` left with the raw `action` and `arg` (`switch_out`'s) and is fully saved;
/// carries the action out. Returns the action and a thread to hand the processor to (ours:
/// runnable and in no queue), or null.
#[inline(always)]
pub fn finish_switch(prev: *const Tcb, action: usize, arg: usize) -> (Switch, *const Tcb) {
    cpu::set(Word::Current, 0);
    // SAFETY: `switch_out` passes the TCB of the thread that just left.
    let prev = unsafe { tcb::from_raw(prev) };
    let action = Switch::from_raw(action);
    timeline::switch_out(prev, action.reason());
    let mut hand_to: *const Tcb = core::ptr::null();
    match action {
        Switch::Yield | Switch::Preempted => make_runnable(prev, false),
        Switch::Park if arg != 0 => {
            // `park_and_run`: nothing can wake `prev` before `hand_to` runs, so no race with a
            // waker here (a plain store, not a locked compare-and-swap).
            hand_to = arg as *const Tcb;
            tcb::event(prev, tcb::EV_PARKED);
            debug_assert_eq!(prev.wake.load(Ordering::Relaxed), tcb::WAITING);
            prev.wake.store(tcb::PARKED, Ordering::Release);
        }
        Switch::Park => {
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
        Switch::Exit => hand_to = retire(prev),
    }
    (action, hand_to)
}

/// The scheduler loop (`dispatch::sched_loop`), set once at start-up ([`set_loop`]).
static LOOP: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Sets the scheduler loop that [`enter_loop`] runs (once, at start-up).
pub fn set_loop(sched_loop: fn() -> !) {
    LOOP.store(sched_loop as *mut (), Ordering::Release);
}

/// Runs the scheduler loop on a fresh scheduler stack (a new activation, a suspended or
/// capturing scheduler's successor: the upcall paths). Never returns.
pub fn enter_loop() -> ! {
    let f = LOOP.load(Ordering::Acquire);
    assert!(!f.is_null(), "no scheduler loop set");
    // SAFETY: only `set_loop` stores here, a `fn() -> !`.
    let f: fn() -> ! = unsafe { core::mem::transmute(f) };
    f()
}

/// Scheduler context: switches to `t` (binding a stack first if it never ran).
/// `inherit`: `t` came from `next` and runs in the current time slice.
pub fn run_now(t: &Tcb, inherit: bool) -> ! {
    if t.stack.get().is_none() {
        let Some(s) = stack::alloc(t.stack_size.get()) else {
            panic!(
                "no memory for a {}-byte stack for thread {}",
                t.stack_size.get(),
                tcb::describe(t)
            );
        };
        t.stack.set(Some(s));
        timeline::first_run(t);
        // SAFETY: a fresh stack nobody uses; its top is 16-byte aligned.
        let sp = unsafe { context::build_start_frame(s.hi & !15, t as *const Tcb as *const u8) };
        // SAFETY: the thread does not run; its saved stack pointer is ours to set.
        unsafe { *t.sp.get() = sp };
    }
    // SAFETY: the thread does not run; its saved stack pointer is ours to read.
    let sp = unsafe { *t.sp.get() };
    match t.stack.get() {
        Some(s) if sp >= s.lo && sp < s.hi => {}
        // Continued inside its CPU-exception handler (`exception_stack::handler_context`).
        _ if exception_stack::on_exception_stack(sp as u64) => {}
        s => {
            percpu::trace(percpu::T_BAD_SP, t as *const Tcb as u64);
            percpu::trace(percpu::T_BAD_SP, sp as u64);
            percpu::print_trace();
            panic!(
                "thread {} would resume with stack pointer {sp:#x} outside its stack {s:x?}; \
                 events {}",
                tcb::describe(t),
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
        wakeup::turn_began(p, now);
        now
    };
    tcb::event(t, tcb::EV_RUNNING);
    t.slice_start.store(start, Ordering::Relaxed);
    percpu::bump(&p.counters.switches);
    slice::on_switch_in(start);
    percpu::trace(percpu::T_SWITCH_IN, t as *const Tcb as u64);
    timeline::switch_in(t);
    // SAFETY: scheduler context; `t` is ours (popped), fully saved, with a valid frame.
    unsafe { context::switch_in(t as *const Tcb as *const u8) }
}

/// Scheduler side of a thread's exit: `t` is saved for good. Returns the joiner this woke, if
/// it was parked: runnable and ours, for the scheduler to run next (null otherwise).
fn retire(t: &Tcb) -> *const Tcb {
    tcb::event(t, tcb::EV_EXITED);
    if let Some(s) = t.stack.take() {
        stack::free(s);
    }
    let joiner = t.join.swap(tcb::JOIN_FINISHED, Ordering::AcqRel);
    let mut run = core::ptr::null();
    if joiner != tcb::JOIN_RUNNING && joiner != tcb::JOIN_FINISHED {
        // SAFETY: a joiner stored its own TCB there and waits for us.
        let j = unsafe { tcb::from_raw(joiner as *const Tcb) };
        if j.wake_owned() {
            run = j as *const Tcb;
        }
    }
    tcb::release(t);
    run
}

/// Wakes `t` if it waits (see `tcb`'s documentation). The TCB must be live at the call (the
/// caller holds the queue it waited in, or a reference). Woken by a running thread, it runs
/// next on this vCPU ([`make_next`]); woken by the scheduler, it joins the run queue.
#[inline]
pub fn wake(t: &Tcb) {
    if t.wake_owned() {
        if cpu::get(Word::InSched) == 0 {
            make_next(t);
        } else {
            make_runnable(t, true);
        }
    }
}

/// Sleeps until [`wake`] (after [`Tcb::prepare_wait`]); `me` is the current thread.
pub fn wait(me: &Tcb) {
    while !me.is_woken() {
        park_current(me);
    }
}

/// Prints the scheduler's global state and every live thread's last event (diagnostics).
/// The addresses of the halted and spinning vCPU masks and of the global queue's length (for
/// the VMM's hang report, `crate::diag`).
pub(crate) fn diag_words() -> (u64, u64, u64) {
    (
        HALTED as *const _ as u64,
        SPINNING as *const _ as u64,
        queue::global_len_address(),
    )
}

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
        queue::global_len(),
        HALTED.load(Ordering::Relaxed),
        SPINNING.load(Ordering::Relaxed)
    );
}
