//! The upcall interrupt and the queue: the handler defers to the scheduler (or, on top of a
//! scheduler holding nothing, handles the records at once), and the scheduler drains the
//! queue at its loop top, one record at a time.

use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::protocol::shared::{UpcallKind, UpcallRecord, RECORD_HAS_CONTEXT};
use activm_stub::{preempt, println, IrqFrame};

use super::recover::{self, later, LATER};
use super::signal;
use crate::activation::{sa, stacks, state};
use crate::arch::cpu::{self, Word};
use crate::arch::entry::CLAIMING;
use crate::arch::{context, rseq};
use crate::percpu;
use crate::sched::in_unsafe_window;
use crate::sched::{self, Pending};

/// Largest sequence number processed so far, and how many records.
static MAX_SEQ: AtomicU64 = AtomicU64::new(0);
pub static RECORDS: AtomicU64 = AtomicU64::new(0);
/// Records by kind (index = kind).
pub static BY_KIND: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
/// Records whose sequence number was not above the previous one of the same queue.
pub static SEQ_ERRORS: AtomicU64 = AtomicU64::new(0);

/// `UPCALL_IRQ`: the scheduler drains the queue; preempt the thread to get there.
pub fn on_upcall(frame: &mut IrqFrame) {
    percpu::bump(&percpu::this().counters.upcalls);
    if sched::irq_prologue(frame) {
        sched::preempt_current();
        return;
    }
    let p = percpu::this();
    // Not on top of an idle scheduler (`SchedIdle`): a context the VMM takes there is dropped
    // as having nothing in flight, and the records this drain had taken would go with it (a
    // lock holder's continuation lost: rt-demo hung beside an I/O-heavy neighbour, which takes
    // its idle vCPUs away often). The idle loop sees the deferred work and drains at its top.
    if cpu::get(Word::InSched) != 0
        && cpu::get(Word::SchedIdle) == 0
        && preempt::held() == 0
        && p.in_drain.load(Ordering::Relaxed) == 0
        && !in_unsafe_window(context::frame_pc(frame))
        && on_own_scheduler(frame)
    {
        // The scheduler, holding nothing, maybe waiting for a lock whose holder's context is
        // in this very queue: handle the records now (Williams 2002, section 6: continue preempted
        // holders before anything else).
        percpu::trace(percpu::T_NESTED, context::frame_pc(frame));
        drain_nested();
        return;
    }
    Pending::Upcall.defer();
}

/// Whether the interrupted code is this activation's own scheduler: the vCPU's words are
/// whole (an activation id, not being claimed) and the interrupt frame lies on the stack
/// `SchedTop` names. Not so in a handler nested in one that interrupted an activation entry
/// (`in_unsafe_window` sees only the inner frame's pc): that runs on the new activation's stack
/// while the words are still the previous activation's, or half reset. A drain there ran a
/// scheduler on those words (a lock holder's continuation suspends "this scheduler" and starts
/// another), so the previous activation's record, handled elsewhere, read a thread the rogue
/// scheduler ran and resumed the old context as that thread's: a thread run twice, a lock
/// holder continued with a scheduler's stack pointer; and the suspended entry, adopted on
/// another vCPU, finished its claim on that vCPU's words. The scheduler between `switch_out`'s
/// `InSched = 1` and its stack switch, or in `switch_in` on the thread's stack, also defers:
/// the loop top drains.
fn on_own_scheduler(frame: &IrqFrame) -> bool {
    let activation = cpu::get(Word::Activation);
    activation != 0
        && activation & CLAIMING == 0
        && stacks::on_act_stack(cpu::get(Word::SchedTop), frame as *const IrqFrame as u64)
}

/// Records waiting in the retry list (diagnostics and tests: zero once things settle).
pub fn records_waiting() -> u32 {
    LATER.len()
}

/// Prints the records in the retry list (diagnostics, once things are quiet).
#[doc(hidden)]
pub fn print_waiting_records() {
    LATER.for_each_item(|r| {
        println!(
            "waiting: kind {} act {} vcpu {} seq {} pc {:#x} sp {:#x}",
            r.kind,
            r.activation,
            r.vcpu,
            r.seq,
            context::pc(&r.context),
            context::sp(&r.context)
        )
    });
}

/// Scheduler context: handles every record of this vCPU's queue (and any left for later). May
/// not return (a continued lock holder, an adopted scheduler context).
pub fn drain() {
    recover::continue_queued_holder();
    recover::adopt_pending();
    if LATER.len() != 0 {
        retry_later();
    }
    if !sa::queue_nonempty() {
        // A drain that ended in a lock holder's continuation or an adoption never got to its
        // refill below; the scheduler that starts afresh afterwards refills here.
        if stacks::pool_low() {
            stacks::refill_pool();
        }
        return;
    }
    let p = percpu::this();
    p.in_drain.store(1, Ordering::Relaxed);
    drain_records(false);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    // Re-arm the time-slice timer at the next switch-in: on our hosts a vCPU's armed one-shot
    // timer was seen never to fire after an upcall interrupt reached it under heavy host load
    // (docs/runtime.md); one APIC write per upcall is cheap insurance.
    cpu::set(Word::Armed, 0);
    stacks::refill_pool();
}

/// Drains the queue from the upcall interrupt, on top of a scheduler holding nothing: resumes
/// contexts and continues lock holders (coming back here), leaves the rest to the loop top.
fn drain_nested() {
    let p = percpu::this();
    p.in_drain.store(1, Ordering::Relaxed);
    drain_records(true);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    // As in `drain`: re-arm the slice timer at the next switch-in.
    cpu::set(Word::Armed, 0);
    // The stacks these records freed go to the pool now (no allocation here: `drain` refills).
    stacks::produce_spares();
    Pending::Upcall.defer();
}

fn drain_records(nested: bool) {
    let mut rec = MaybeUninit::<UpcallRecord>::uninit();
    let mut last_seq = 0u64;
    // SAFETY: `take_record` writes a whole record before returning true.
    while rseq::take_record(unsafe { &mut *rec.as_mut_ptr() }) {
        // SAFETY: as above.
        let r = unsafe { rec.assume_init_ref() };
        if r.seq <= last_seq {
            SEQ_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        last_seq = r.seq;
        MAX_SEQ.fetch_max(r.seq, Ordering::AcqRel);
        RECORDS.fetch_add(1, Ordering::Relaxed);
        percpu::bump(&percpu::this().counters.records);
        if let Some(slot) = BY_KIND.get(r.kind as usize) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
        if nested {
            handle_nested(r);
        } else {
            handle(r);
        }
    }
}

fn handle_nested(r: &UpcallRecord) {
    percpu::trace(
        percpu::T_RECORD,
        (1 << 52) | (u64::from(r.kind) << 48) | r.seq,
    );
    match UpcallKind::from_raw(r.kind) {
        Some(UpcallKind::Preempted | UpcallKind::Unblocked)
            if r.flags & RECORD_HAS_CONTEXT != 0 =>
        {
            recover::resume_context(r, true)
        }
        Some(UpcallKind::Blocked) => recover::blocked(r),
        Some(UpcallKind::NewProc) => new_proc(r),
        _ => later(r),
    }
}

/// Handles what was left for later, each waiting record once per pass (records left again
/// wait for the next pass). Not `pop` in a loop: a record pushed back lands in the slot it was
/// taken from and would be taken again at once, so one record whose state never comes kept
/// every other waiting record from being retried (rt-demo hung beside a flush storm, a lock
/// holder's PREEMPTED record waiting behind one of an activation preempted in its start).
fn retry_later() {
    // A pass that handles nothing leaves no trace (it would flood the ring).
    let before = LATER.len();
    let trace_at = percpu::this().trace_at.load(Ordering::Relaxed);
    let mut from = 0;
    while let Some((at, r)) = LATER.pop_from(from) {
        from = at + 1;
        handle(&r);
    }
    if LATER.len() == before {
        percpu::this().trace_at.store(trace_at, Ordering::Relaxed);
    }
}

/// NEWPROC: if `arg` names the activation this vCPU had before and it ended by `sa_yield` (no
/// other record will name it), its idle scheduler's state is dropped and its stack recycled.
fn new_proc(r: &UpcallRecord) {
    sa::note_new_activation(r.vcpu);
    if r.arg == 0 {
        return;
    }
    if let Some(st) = state::take_state(r.arg as u32, r.vcpu) {
        if st.in_sched {
            sched::clear_idle_bits(st.vcpu);
            stacks::release_act_stack(st.sched_top);
        }
    }
}

fn handle(r: &UpcallRecord) {
    percpu::trace(percpu::T_RECORD, (u64::from(r.kind) << 48) | r.seq);
    match UpcallKind::from_raw(r.kind) {
        Some(UpcallKind::NewProc) => new_proc(r),
        Some(UpcallKind::Preempted | UpcallKind::Unblocked) => {
            if r.flags & RECORD_HAS_CONTEXT != 0 {
                recover::resume_context(r, false);
            }
        }
        Some(UpcallKind::Blocked) => recover::blocked(r),
        Some(UpcallKind::Signal) => signal::signal(r.arg),
        Some(UpcallKind::User) => signal::user(r.arg as u32),
        None => println!(
            "activm-rt: ignoring an upcall record of unknown kind {}",
            r.kind
        ),
    }
}

/// Statistics of the upcall path: (records, max sequence number, out-of-order records).
pub(super) fn record_stats() -> (u64, u64, u64) {
    (
        RECORDS.load(Ordering::Relaxed),
        MAX_SEQ.load(Ordering::Relaxed),
        SEQ_ERRORS.load(Ordering::Relaxed),
    )
}
