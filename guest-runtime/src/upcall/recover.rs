//! Context recovery (Williams 2002, section 6): resuming the contexts of PREEMPTED and UNBLOCKED
//! records, contexts taken inside an activation entry, continuing preempted lock holders at
//! once, and adopting the scheduler contexts of other activations.

use core::sync::atomic::Ordering;

use activm_stub::println;
use activm_stub::protocol::shared::{UpcallKind, UpcallRecord};
use activm_stub::protocol::timeline::RecordAction;

use crate::activation::bag::Bag;
use crate::activation::poison;
use crate::activation::stacks::{self, act_stack_top_of, release_act_stack};
use crate::activation::state::{file_old_state, take_state, ActState, TABLE};
use crate::arch::cpu::{self, Word};
use crate::arch::entry::{self, CLAIMING, ENTRY_MARK_OFFSET};
use crate::arch::{context, rseq, UserContext};
use crate::sched::{self, Pending};
use crate::tcb::{self, Tcb};
use crate::{percpu, timeline};

/// Records that could not be handled yet (their activation's state was not filed yet): the
/// drain retries them.
pub(super) static LATER: Bag<UpcallRecord, 64> = Bag::new();

/// Puts `r` on the retry list ([`LATER`]).
pub(super) fn later(r: &UpcallRecord) {
    LATER.push(0, *r);
}

/// Whether the drain (`drain::drain`) has anything to do (the scheduler's direct hand-offs skip the loop only
/// when it has not).
#[inline]
pub fn loop_work() -> bool {
    continuations_queued() != 0
        || adoptions_queued() != 0
        || LATER.len() != 0
        || crate::activation::sa::queue_nonempty()
}

/// Activations whose UNBLOCKED was handled before their BLOCKED (the VMM keeps both in one
/// queue while it can, but a BLOCKED copied out by a scheduler that was then preempted is
/// handled wherever that scheduler is adopted): their BLOCKED is dropped when it comes.
static UNBLOCKED_EARLY: Bag<(), 64> = Bag::new();

/// BLOCKED: the thread that ran on that activation is blocked in the VMM.
pub(super) fn blocked(r: &UpcallRecord) {
    sched::rescue_ring_of(r.vcpu);
    let Some(st) = take_state(r.activation, r.vcpu) else {
        if UNBLOCKED_EARLY.take_key(u64::from(r.activation)).is_none() {
            later(r);
        }
        return;
    };
    if st.current != 0 && !st.in_sched {
        // SAFETY: the thread that ran on that activation; it stays blocked (no one else has it).
        let t = unsafe { tcb::from_raw(st.current as *const Tcb) };
        t.flags
            .fetch_or(tcb::FLAG_BLOCKED_IN_VMM, Ordering::Relaxed);
        t.blocked_activation.store(r.activation, Ordering::Relaxed);
        timeline::record_handled(r, Some(t), RecordAction::BlockedInVmm);
    }
    // Keep the state for the UNBLOCKED record.
    TABLE.push(u64::from(st.activation), st);
}

/// Fixes a handed-over context's instruction pointer: a restartable sequence is rewound to
/// its abort address, and the trampoline skips its EOI.
fn fix_pc(ctx: &mut UserContext) {
    if let Some(abort) = rseq::fixup(context::pc(ctx)) {
        context::set_pc(ctx, abort);
        percpu::bump(&percpu::this().counters.rseq_rewinds);
    }
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    if (trap_start..trap_end).contains(&context::pc(ctx)) {
        // That EOI was owed to the other vCPU's APIC; its next activation clears it.
        context::set_pc(ctx, trap_end);
    }
}

/// A context taken inside `__rt_activation_entry` (before its words were reset): file what
/// the entry had saved, drop the new activation's context and give back its stack.
fn resolve_entry_context(r: &UpcallRecord) -> bool {
    match entry::in_entry(&r.context) {
        Some(at) => resolve_in_entry(r, at),
        None => false,
    }
}

/// A context taken in an interrupt handler on top of a new activation's entry after its first
/// instruction (`entry::under_entry_interrupt`): resolved as a context stopped at that entry
/// instruction. (Otherwise its record would wait forever for a state nobody files, its stack
/// leaked, and, had the entry claimed the vCPU, the previous activation's saved state lost.)
fn resolve_entry_interrupt_context(r: &UpcallRecord) -> bool {
    let Some(top) = act_stack_top_of(context::sp(&r.context)) else {
        return false;
    };
    match entry::under_entry_interrupt(&r.context, top) {
        Some(at) => resolve_in_entry(r, at),
        None => false,
    }
}

/// The entry of record `r`'s activation stopped as `at` says: file what it saved if it claimed
/// the vCPU, drop it and give back its stack.
fn resolve_in_entry(r: &UpcallRecord, at: entry::InEntry) -> bool {
    let top = at.stack_top;
    percpu::trace(percpu::T_ENTRY_CTX, at.pc);
    if let Some(old) = at.saved {
        file_old_state(r.vcpu, &old);
        // Unless the vCPU's next activation claimed it already (it then files nothing).
        let _ = cpu::word_of(r.vcpu, Word::Activation).compare_exchange(
            u64::from(r.activation) | CLAIMING,
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    sched::clear_idle_bits(r.vcpu);
    handed_out_and_back(top);
    percpu::bump(&percpu::this().counters.dropped_idle_contexts);
    true
}

/// Gives back the stack of a new activation dropped in its entry: the VMM handed it out, though
/// the activation never reached `__rt_activation_start`.
fn handed_out_and_back(top: u64) {
    if poison::on() {
        poison::handed_out(top);
    }
    release_act_stack(top);
}

/// A context taken in an interrupt handler (or the trampoline around it) that runs on top of a
/// new activation's first instruction: that activation did nothing (its handlers only defer,
/// and the entry drops what they deferred), so the context is dropped and its stack given
/// back. Its state can never be taken: the activation never claimed the vCPU's words.
fn drop_entry_interrupt_context(r: &UpcallRecord) -> bool {
    let Some(top) = act_stack_top_of(context::sp(&r.context)) else {
        return false;
    };
    // SAFETY: `top` is an activation stack's top (registered when made), so the word under it
    // is guest memory inside that stack; the stack's activation no longer runs.
    let mark = unsafe { ((top - ENTRY_MARK_OFFSET) as *const u64).read_volatile() };
    if mark != entry::window().0 {
        return false;
    }
    percpu::trace(percpu::T_ENTRY_CTX, context::pc(&r.context));
    sched::clear_idle_bits(r.vcpu);
    handed_out_and_back(top);
    percpu::bump(&percpu::this().counters.dropped_idle_contexts);
    true
}

/// Resumes the context of a PREEMPTED or UNBLOCKED record on this vCPU. `nested`: on top of an
/// interrupted scheduler, which must get control back: lock holders are continued with
/// `cont_swap`, and scheduler contexts wait for the loop top to be adopted.
pub(super) fn resume_context(r: &UpcallRecord, nested: bool) {
    if r.kind == UpcallKind::Preempted as u32 {
        sched::rescue_ring_of(r.vcpu);
    }
    if resolve_entry_context(r) {
        return;
    }
    percpu::trace(
        percpu::T_RECINFO,
        (u64::from(r.activation) << 32) | (u64::from(r.vcpu) << 24) | (r.seq & 0xff_ffff),
    );
    let Some(st) = take_state(r.activation, r.vcpu) else {
        if drop_entry_interrupt_context(r) || resolve_entry_interrupt_context(r) {
            return;
        }
        percpu::trace(percpu::T_LATER, r.seq);
        timeline::record_handled(r, None, RecordAction::Later);
        later(r);
        return;
    };
    percpu::trace(
        percpu::T_TAKE,
        (u64::from(st.in_sched) << 52)
            | (u64::from(st.sched_idle) << 51)
            | (st.hold.min(7) << 48)
            | (st.current & 0xffff_ffff),
    );
    percpu::trace(percpu::T_TAKE, context::sp(&r.context));
    let mut ctx = r.context;
    // Taken in a CPU-exception handler: resumed at the faulting instruction where it may be.
    crate::exception_stack::handler_context(&mut ctx);
    fix_pc(&mut ctx);
    if st.in_sched && nested && !st.sched_idle {
        timeline::record_handled(r, None, RecordAction::Adopted);
        percpu::trace(
            percpu::T_ADOPT_QUEUED,
            (st.hold.min(0xff) << 48) | (context::pc(&ctx) & 0xffff_ffff_ffff),
        );
        // A holder of a spinlock is adopted before other contexts: they may be waiting for it.
        let key = if st.hold > 0 { ADOPT_HOLDER } else { 0 };
        ADOPT.push(key, Adopt::Context(st, ctx));
        return;
    }
    if st.in_sched {
        if st.sched_idle {
            // An idle scheduler: nothing in flight.
            percpu::trace(percpu::T_DROP_IDLE, context::pc(&ctx));
            timeline::record_handled(r, None, RecordAction::Dropped);
            sched::clear_idle_bits(st.vcpu);
            release_act_stack(st.sched_top);
            percpu::bump(&percpu::this().counters.dropped_idle_contexts);
            return;
        }
        timeline::record_handled(r, None, RecordAction::Adopted);
        adopt(&ctx, st);
    }
    if st.current == 0 {
        println!(
            "activm-rt: dropping a context of activation {} with no thread",
            r.activation
        );
        return;
    }
    // SAFETY: the thread that ran on that activation; nobody else resumes it (its state was
    // taken exactly once).
    let t = unsafe { tcb::from_raw(st.current as *const Tcb) };
    let was_blocked = t
        .flags
        .fetch_and(!tcb::FLAG_BLOCKED_IN_VMM, Ordering::Relaxed)
        & tcb::FLAG_BLOCKED_IN_VMM
        != 0;
    if r.kind == UpcallKind::Unblocked as u32 && !was_blocked {
        UNBLOCKED_EARLY.push(u64::from(r.activation), ());
    }
    // SAFETY: the context is this guest's, taken at CPL3 on the thread's own stack; below its
    // stack pointer is free (the thread is not running).
    let sp = unsafe { context::build_resume_frame(&ctx) };
    // SAFETY: the thread does not run; its saved stack pointer is ours to set.
    unsafe { *t.sp.get() = sp };
    percpu::trace(percpu::T_BUILD, t as *const Tcb as u64);
    percpu::trace(percpu::T_BUILD, sp as u64);
    percpu::bump(&percpu::this().counters.resumed_contexts);
    tcb::event(t, tcb::EV_RESUMED);
    percpu::trace(percpu::T_RESUME, context::pc(&ctx));
    let action = if st.hold > 0 {
        RecordAction::Continued
    } else if r.kind == UpcallKind::Unblocked as u32 {
        RecordAction::RunNext
    } else {
        RecordAction::Requeued
    };
    timeline::record_handled(r, Some(t), action);
    if st.hold > 0 {
        tcb::event(t, tcb::EV_CONTINUED);
        if !nested {
            continue_holder(t, st.hold);
        }
        // On top of an interrupted scheduler (which may be spinning for this very holder's
        // lock): queue the continuation, which every scheduler loop serves first, and get the
        // interrupted scheduler out of the way; a scheduler adopts it back afterwards.
        CONTINUE.push(0, (t as *const Tcb as u64, st.hold));
        suspend_this_scheduler();
        return;
    }
    if r.kind == UpcallKind::Unblocked as u32 {
        // Its I/O just completed: it runs next here, ahead of threads that have been computing
        // (the thread the upcall interrupted goes back to the queue), as a Unix scheduler
        // favours a process woken from I/O.
        sched::make_next(t);
    } else {
        sched::make_runnable(t, false);
    }
}

/// Lock holders to continue before anything else: `(TCB, hold count)`.
static CONTINUE: Bag<(u64, u64), 64> = Bag::new();

/// Lock holders waiting for their continuation.
pub(super) fn continuations_queued() -> u32 {
    CONTINUE.len()
}

/// Scheduler contexts waiting to be adopted.
pub(super) fn adoptions_queued() -> u32 {
    ADOPT.len()
}

/// Loop top: continues a queued lock holder, if any (does not return then).
pub(super) fn continue_queued_holder() {
    if CONTINUE.len() != 0 {
        if let Some((t, hold)) = CONTINUE.pop() {
            // SAFETY: a saved lock holder queued by `resume_context`; ours now.
            continue_holder(unsafe { tcb::from_raw(t as *const Tcb) }, hold);
        }
    }
}

/// Scheduler context at its loop top: runs the lock holder `t` (its resume frame built) now,
/// with its holds moved here, until its last release (Williams 2002, section 6); the safepoint then
/// switches it out (`PEND_CONT`) and this vCPU's scheduler starts afresh.
fn continue_holder(t: &Tcb, hold: u64) -> ! {
    // Leaving the scheduler (and whatever drain called this) for good.
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    percpu::trace(percpu::T_CONTINUE, t as *const Tcb as u64);
    percpu::bump(&percpu::this().counters.continuations);
    cpu::set_hold(hold);
    Pending::Cont.defer();
    sched::run_now(t, false)
}

/// From the upcall handler on top of a scheduler: leaves that scheduler suspended (adopted back
/// by a scheduler loop later) and runs a fresh one on a spare activation stack. Without a
/// spare stack the interrupted scheduler just goes on (the continuation waits for a loop top).
fn suspend_this_scheduler() {
    let Some(top) = stacks::take_spare_stack() else {
        return;
    };
    percpu::trace(percpu::T_SUSPEND, top);
    // SAFETY: scheduler context (InSched = 1); `top` is a free activation stack.
    unsafe { context::suspend_scheduler(top, suspended) };
    // Adopted back: this drain goes on, as the scheduler of whatever vCPU runs it now.
}

/// The fresh scheduler after `suspend_this_scheduler`, on the spare stack.
extern "C" fn suspended(sp: u64, sched_top: u64) -> ! {
    ADOPT.push(0, Adopt::Suspended { sp, sched_top });
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    sched::enter_loop()
}

/// A scheduler context to adopt at the loop top.
// Stored inline in a fixed array on purpose: boxing the context would allocate on the upcall path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
enum Adopt {
    /// Taken by the VMM with this state.
    Context(ActState, UserContext),
    /// A scheduler that suspended itself for a lock holder's continuation.
    Suspended { sp: u64, sched_top: u64 },
}

/// Sized for bursts: every entry is a scheduler context on its own activation stack.
static ADOPT: Bag<Adopt, 64> = Bag::new();
/// The key of a scheduler context in [`ADOPT`] that holds a spinlock: adopted first.
const ADOPT_HOLDER: u64 = 1;

/// Whether a scheduler context holding a spinlock waits to be adopted (a scheduler spinning for
/// a lock then asks for processors: `dispatch::points::lock_wait`).
pub(crate) fn holder_waits_for_adoption() -> bool {
    ADOPT.len() != 0 && ADOPT.has_key(ADOPT_HOLDER)
}

/// Prints the scheduler contexts waiting to be adopted (diagnostics, once things are quiet).
pub(super) fn print_waiting_adoptions() {
    ADOPT.for_each_item(|a| match a {
        Adopt::Context(st, ctx) => println!(
            "activm-rt: to adopt: activation {} (vCPU {}) hold {} current {:#x} pc {:#x} sp {:#x}",
            st.activation,
            st.vcpu,
            st.hold,
            st.current,
            context::pc(ctx),
            context::sp(ctx)
        ),
        Adopt::Suspended { sp, sched_top } => {
            println!("activm-rt: to adopt: a suspended scheduler, sp {sp:#x} stack {sched_top:#x}")
        }
    });
}

/// Loop top: adopts a pending scheduler context, if any (does not return then).
pub(super) fn adopt_pending() {
    if ADOPT.len() == 0 {
        return;
    }
    // Lock holders first: a scheduler adopted before the holder of the lock it spins for would
    // spin again, never reaching a loop top.
    match ADOPT.take_key(ADOPT_HOLDER).or_else(|| ADOPT.pop()) {
        Some(Adopt::Context(st, ctx)) => adopt(&ctx, st),
        Some(Adopt::Suspended { sp, sched_top }) => {
            // It was suspended inside a drain (from the upcall handler); set before the switch
            // (see `adopt`).
            percpu::this().in_drain.store(1, Ordering::Relaxed);
            percpu::trace(percpu::T_ADOPT_SUSPENDED, sp);
            percpu::bump(&percpu::this().counters.adoptions);
            // This scheduler's own stack is given up, by the switch (see `adopt`).
            let own = cpu::get(Word::SchedTop);
            cpu::set(Word::SchedTop, sched_top);
            cpu::set(Word::Current, 0);
            cpu::set_hold(0);
            // SAFETY: scheduler context; the frame was saved by `cont_swap` on a stack nobody
            // else uses (its vCPU was taken away); nothing runs on `own` after the switch.
            unsafe { context::resume_switch_frame(sp as usize, own) }
        }
        None => {}
    }
}

/// Continues another activation's scheduler context as this vCPU's scheduler.
///
/// No upcall drain may nest in here until the jump: a nested drain that suspended "this
/// scheduler" (to continue a lock holder) would leave its frame on the stack the jump gives
/// back. So `in_drain` stays set (it is, when called from a drain) until then (and an interrupt
/// whose frame is not on `SchedTop`'s stack defers anyway).
fn adopt(ctx: &UserContext, st: ActState) -> ! {
    percpu::this().in_drain.store(1, Ordering::Relaxed);
    percpu::trace(percpu::T_ADOPT_CTX, context::pc(ctx));
    percpu::bump(&percpu::this().counters.adoptions);
    sched::clear_idle_bits(st.vcpu);
    // This scheduler's own stack is given up; the adopted one's becomes this vCPU's. The own
    // one is in use until the jump, which gives it back once on the adopted stack: if the VMM
    // takes this context before that, the stack stays with it (`__rt_release_left_stack`).
    let own = cpu::get(Word::SchedTop);
    // SAFETY: the context is a scheduler context of this guest taken at CPL3 on its own
    // activation stack, which nobody else uses now.
    let sp = unsafe { context::build_resume_frame(ctx) };
    cpu::set(Word::SchedTop, st.sched_top);
    cpu::set(Word::Current, st.current);
    cpu::set_hold(st.hold);
    // This scheduler's drain is abandoned. The adopted context may itself have been draining
    // (taken at its loop top, or in a nested drain); its words do not say, so it continues as
    // one that was not: an upcall may then drain nested on top of it, which every record
    // handler allows (records of one queue handled by two drains, out of order: `LATER`,
    // `UNBLOCKED_EARLY`), and its own drain clears the flag again when it ends.
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    // The abandoned drain may leave records queued (a new activation's batch), their interrupt
    // spent, and the adopted context may switch straight into a thread, having decided about
    // the slice timer from its old vCPU's `Armed` word (in its registers). A soak run spun
    // 30 s here: the thread waited for a spinlock whose holder's record was left in the queue,
    // with no timer armed. So: the records are deferred work (a lock wait's `check_pending`,
    // a hold's release or the loop top drains them), and this vCPU's timer ends the slice.
    if loop_work() {
        Pending::Upcall.defer();
    }
    crate::alarm::tick_by(cpu::rdtsc().saturating_add(crate::config::slice_ticks()));
    // SAFETY: scheduler context (InSched = 1); the frame was built above; nothing runs on
    // `own` after the jump.
    unsafe { context::jump_to_frame(sp, own) }
}
