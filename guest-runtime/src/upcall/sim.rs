//! A simulated VMM for self-tests without the VMM's activations (`--no-activations` or
//! `--rt-sa=off`): it writes records into the guest's own queues exactly as the VMM would
//! (whole record, then the head with release, then the upcall interrupt), and takes a thread
//! away from a vCPU the way the VMM does (its full context, the vCPU continuing with a new
//! activation).
use alloc::boxed::Box;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::shared::{
    UpcallKind, UpcallRecord, RECORD_HAS_CONTEXT, UPCALL_QUEUE_CAPACITY,
};
use activm_stub::sync::SpinLock;
use activm_stub::{preempt, IrqFrame};

use super::entry::OUR_VECTORS;
use super::VECTOR_SIM;
use crate::activation::sa::{activations_enabled, area};
use crate::activation::state::{ActState, TABLE};
use crate::arch::cpu::{self, Word};
use crate::arch::{context, rseq, UserContext, UPCALL_IRQ};
use crate::sched::in_unsafe_window;
use crate::{percpu, sched};

static LOCK: SpinLock<()> = SpinLock::new(());
static SEQ: AtomicU64 = AtomicU64::new(0);
static NEXT_ACTIVATION: AtomicU32 = AtomicU32::new(1000);

/// What to do with the captured thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// Hand it over to `deliver_to` in a PREEMPTED record.
    Preempt { deliver_to: u32 },
    /// Keep it "blocked in the VMM": a BLOCKED record goes to the vCPU itself; call
    /// [`Request::unblock`] later.
    Block,
}

/// A capture request for one vCPU ([`request`]).
#[derive(Debug)]
pub struct Request {
    capture: Capture,
    /// Only this thread (TCB address), or any thread if 0.
    victim: u64,
    /// Only while the victim holds a preemption hold (true), only while it holds none
    /// (false), or either.
    held: Option<bool>,
    done: AtomicBool,
    activation: AtomicU32,
    vcpu: AtomicU32,
    /// Whether the captured instruction pointer was inside a restartable sequence.
    in_rseq: AtomicBool,
    /// The captured context (stored inline: the capture runs in interrupt context, where
    /// the interrupted thread may hold the heap lock).
    context: SpinLock<Option<UserContext>>,
}

impl Request {
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub fn captured_in_rseq(&self) -> bool {
        self.in_rseq.load(Ordering::Acquire)
    }

    /// The activation the captured thread ran on.
    pub fn activation(&self) -> u32 {
        self.activation.load(Ordering::Acquire)
    }

    /// For a `Block` capture: the "I/O" completes; an UNBLOCKED record with the thread's
    /// context goes to `deliver_to`.
    pub fn unblock(&self, deliver_to: u32) {
        let ctx = self.context.lock().take().expect("nothing blocked");
        post(
            deliver_to,
            UpcallKind::Unblocked,
            self.activation(),
            self.vcpu.load(Ordering::Acquire),
            0,
            Some(&ctx),
        );
    }
}

static REQUESTS: [AtomicPtr<Request>; 64] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 64];
/// What the interrupted vCPU posts once it left the captured thread's stack.
static OUTBOX: [AtomicPtr<Request>; 64] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 64];

fn check() {
    assert!(
        !activations_enabled(),
        "the simulated VMM needs the VMM's activations off (activm run --no-activations, or --rt-sa=off)"
    );
}

/// Writes one record into `target`'s queue as the VMM would, then raises the upcall
/// interrupt there. Returns its sequence number.
pub fn post(
    target: u32,
    kind: UpcallKind,
    activation: u32,
    vcpu: u32,
    arg: u64,
    context: Option<&UserContext>,
) -> u64 {
    check();
    let a = area(target);
    let seq;
    loop {
        let _g = LOCK.lock();
        let head = a.queue_head.load(Ordering::Relaxed);
        let tail = a.queue_tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) as usize >= UPCALL_QUEUE_CAPACITY {
            drop(_g);
            core::hint::spin_loop();
            continue;
        }
        seq = SEQ.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = head as usize % UPCALL_QUEUE_CAPACITY;
        let at = core::ptr::addr_of!(a.records[slot]) as *mut UpcallRecord;
        let mut rec = UpcallRecord {
            seq,
            kind: kind as u32,
            flags: 0,
            activation,
            vcpu,
            delivered_to: cpu::get_of(target, Word::Activation) as u32,
            _pad: 0,
            arg,
            tsc: cpu::rdtsc(),
            _reserved: [0; 2],
            context: UserContext::default(),
        };
        if let Some(ctx) = context {
            rec.flags |= RECORD_HAS_CONTEXT;
            rec.context = *ctx;
        }
        // SAFETY: slot `head % CAP` is free (head - tail < CAP); the consumer reads it only
        // after the release store of the head below; producers are serialised by LOCK.
        unsafe { at.write_volatile(rec) };
        a.queue_head.store(head.wrapping_add(1), Ordering::Release);
        break;
    }
    let hold = preempt::Hold::new();
    if target == activm_stub::vcpu_id() {
        cpu::send_self_ipi(UPCALL_IRQ);
    } else {
        cpu::send_ipi(percpu::of(target).apic_id, UPCALL_IRQ);
    }
    drop(hold);
    seq
}

/// The activation now running on vCPU `vcpu`.
pub fn activation_of(vcpu: u32) -> u32 {
    cpu::get_of(vcpu, Word::Activation) as u32
}

/// Asks the simulated VMM to take a thread away at the next suitable interrupt on any
/// vCPU (its timer, or the interrupt [`kick_all`] sends): the running thread (or only
/// `victim`), while it holds a preemption hold or not (`held`; `None`: either). Poll
/// [`Request::is_done`].
pub fn request(
    capture: Capture,
    victim: Option<&crate::thread::Thread>,
    held: Option<bool>,
) -> &'static Request {
    check();
    let req = Box::leak(Box::new(Request {
        capture,
        victim: victim.map_or(0, |t| t.tcb_addr()),
        held,
        done: AtomicBool::new(false),
        activation: AtomicU32::new(0),
        vcpu: AtomicU32::new(0),
        in_rseq: AtomicBool::new(false),
        context: SpinLock::new(None),
    }));
    for slot in REQUESTS.iter().take(percpu::nr_vcpus() as usize) {
        assert!(
            slot.compare_exchange(
                core::ptr::null_mut(),
                req,
                Ordering::AcqRel,
                Ordering::Acquire
            )
            .is_ok(),
            "a capture request is pending"
        );
    }
    req
}

impl Request {
    /// Withdraws the request where it has not been acted on.
    pub fn cancel(&'static self) {
        withdraw(self);
    }
}

fn withdraw(req: &Request) {
    let p = req as *const Request as *mut Request;
    for slot in REQUESTS.iter() {
        let _ = slot.compare_exchange(
            p,
            core::ptr::null_mut(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// Sends the simulated VMM's interrupt to every vCPU (to act on a request now).
pub fn kick_all() {
    let me = activm_stub::vcpu_id();
    let hold = preempt::Hold::new();
    for v in 0..percpu::nr_vcpus() {
        if v == me {
            cpu::send_self_ipi(VECTOR_SIM);
        } else {
            cpu::send_ipi(percpu::of(v).apic_id, VECTOR_SIM);
        }
    }
    drop(hold);
}

/// Interrupt context on vCPU `me`, before the handler's own work: captures the interrupted
/// thread if a request asks for it. Does not return if it does.
pub(super) fn on_interrupt(frame: &IrqFrame) {
    let me = activm_stub::vcpu_id();
    let slot = &REQUESTS[me as usize];
    let req = slot.load(Ordering::Acquire);
    if req.is_null() {
        return;
    }
    // SAFETY: requests are leaked; this one is pending for this vCPU.
    let r = unsafe { &*req };
    percpu::trace(percpu::T_SIM_SAW, context::frame_pc(frame));
    let current = sched::current_raw() as u64;
    let hold = preempt::held();
    let suitable = cpu::get(Word::InSched) == 0
        && current != 0
        && (r.victim == 0 || r.victim == current)
        && r.held.is_none_or(|h| h == (hold > 0))
        && !in_unsafe_window(context::frame_pc(frame));
    if !suitable
        || slot
            .compare_exchange(
                req,
                core::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
    {
        return;
    }
    withdraw(r);
    r.vcpu.store(me, Ordering::Release);
    // From here on this vCPU behaves as if the VMM took the thread away and started a new
    // activation: no interrupt may treat the thread as running here any more.
    cpu::set(Word::InSched, 1);
    cpu::set_hold(0);
    let _ = cpu::take_pending();
    let ctx = context::capture(frame);
    r.in_rseq
        .store(rseq::fixup(context::pc(&ctx)).is_some(), Ordering::Release);
    let new_act = NEXT_ACTIVATION.fetch_add(1, Ordering::Relaxed);
    let old_act = cpu::get(Word::Activation);
    cpu::set(Word::Activation, u64::from(new_act));
    cpu::set(Word::Current, 0);
    cpu::set(Word::SchedIdle, 0);
    r.activation.store(old_act as u32, Ordering::Release);
    *r.context.lock() = Some(ctx);
    // The thread's state, as the new activation's entry would file it (it keeps this
    // vCPU's scheduler stack, which was free: a thread ran).
    TABLE.push(
        old_act,
        ActState {
            activation: old_act as u32,
            vcpu: me,
            current,
            hold,
            in_sched: false,
            sched_idle: false,
            sched_top: 0,
        },
    );
    OUTBOX[me as usize].store(req, Ordering::Release);
    // SAFETY: the thread's stack now belongs to its context; this vCPU is in the scheduler.
    unsafe { context::abandon_to_scheduler(after_capture) }
}

/// On the scheduler stack of the vCPU that captured a thread: post the record(s).
extern "C" fn after_capture() -> ! {
    let me = activm_stub::vcpu_id();
    let req = OUTBOX[me as usize].swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: set just before the jump here; requests are leaked.
    let r = unsafe { &*req };
    cpu::end_owed_interrupts(&OUR_VECTORS);
    let activation = r.activation();
    match r.capture {
        Capture::Preempt { deliver_to } => {
            let ctx = r.context.lock().take().expect("captured context");
            post(
                deliver_to,
                UpcallKind::Preempted,
                activation,
                me,
                0,
                Some(&ctx),
            );
        }
        Capture::Block => {
            post(me, UpcallKind::Blocked, activation, me, 0, None);
        }
    }
    r.done.store(true, Ordering::Release);
    sched::enter_loop()
}
