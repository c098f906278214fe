//! Idle vCPUs' bits (spinning for work, halted) and waking one when work appears (Go's
//! `wakep`): a reschedule IPI to a halted vCPU, or, when none idles here and some gave their
//! processors back to the VMM, an ask for them (`activation::sa::want_processors`). How a
//! vCPU idles is `dispatch::idle`'s.
//!
//! A wake-up is not always worth an IPI. Waking a halted vCPU costs about what getting a
//! processor does (`C`, `activation::cost`: the interrupt's entry, the vCPU's run and its next
//! halt; 100-200 us of host CPU here), and the woken thread starts only after the interrupt
//! arrives. A thread woken by a thread whose vCPU runs short turns (a server's request
//! handler: ~1 us) starts sooner where it is, when the waker blocks. So a wake-up from a
//! thread leaves the woken thread to its own vCPU while the queued work there, at this vCPU's
//! average turn, ends sooner than a halted vCPU would wake (the measured IPI latency), and the
//! waker's turn so far is shorter than that too (Caladan and Shenango add a core only when
//! queued work waits). A key-value server on two vCPUs interrupted the halted one for one
//! request in 55 and spent 19-21 us of host CPU per request, against 10 on one vCPU
//! (`docs/net.md`). If the waker then runs long after all, its slice timer (armed by the
//! wake-up) ends its turn, and the scheduler wakes a vCPU then.
//!
//! Not while other guests take the processors this one gives back
//! (`sa::processors_contended`): a sibling left idle then gives its processor away, and the
//! queue kept here soon waits long enough to ask for it back, taking it from the other guest
//! every few tens of milliseconds (a server beside N-body: 69 processor transfers in 4 s
//! against 3, the batch guest at a third of its speed). Then wake-ups go out as before, and
//! readiness batches stay local up to 32 threads.

use core::sync::atomic::{fence, AtomicU64, Ordering};

use activm_stub::preempt;

use crate::activation::{cost, sa};
use crate::arch::cpu::{self, Word};
use crate::arch::RESCHEDULE_IRQ;
use crate::percpu;

/// The idle vCPUs, on a line of their own (every spawn and wake-up reads it; idle vCPUs write
/// it): `spinning` looking for work, `halted` (or about to halt), a bit per vCPU.
struct IdleBits {
    spinning: AtomicU64,
    halted: AtomicU64,
}
static IDLE: percpu::Line<IdleBits> = percpu::Line(IdleBits {
    spinning: AtomicU64::new(0),
    halted: AtomicU64::new(0),
});
pub(crate) static SPINNING: &AtomicU64 = &IDLE.0.spinning;
pub(crate) static HALTED: &AtomicU64 = &IDLE.0.halted;

/// If vCPUs are halted and none is spinning, wakes one with a reschedule IPI (Go's `wakep`).
pub fn wake_idle_vcpu() {
    if percpu::nr_vcpus() == 1 {
        return;
    }
    fence(Ordering::SeqCst);
    wake_idle_vcpu_after_rmw();
}

/// [`wake_idle_vcpu`] after the work was published by a SeqCst read-modify-write (a full
/// barrier already: no fence needed).
pub(super) fn wake_idle_vcpu_after_rmw() {
    if percpu::nr_vcpus() == 1 {
        return;
    }
    if SPINNING.load(Ordering::SeqCst) != 0 {
        return;
    }
    let me = 1u64 << activm_stub::vcpu_id();
    let halted = HALTED.load(Ordering::SeqCst) & !me;
    if halted == 0 {
        // Nobody here to wake: if vCPUs gave their processors back idle, ask for them again,
        // unless the waker is this vCPU's scheduler (no thread current): it runs the work
        // next, and asks itself if more waits behind it (`dispatch::sched_loop`). Asking here made a
        // server that woke its own sleeper take a second processor from a batch guest for
        // every request (`cargo xtask bench latency`).
        if cpu::get(Word::Current) != 0 {
            sa::want_processors();
        }
        return;
    }
    if keep_local() {
        percpu::bump(&percpu::this().counters.wakes_kept);
        return;
    }
    let v = halted.trailing_zeros();
    let bit = 1u64 << v;
    if HALTED.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
        let hold = preempt::Hold::new();
        percpu::of(v)
            .woken_at
            .store(cpu::rdtsc(), Ordering::Relaxed);
        cpu::send_ipi(percpu::of(v).apic_id, RESCHEDULE_IRQ);
        percpu::bump(&percpu::this().counters.ipis_sent);
        drop(hold);
    }
}

/// Whether a thread's wake-up should leave the woken thread to this vCPU (see the module).
fn keep_local() -> bool {
    if cpu::get(Word::Current) == 0 || sa::processors_contended() {
        // The scheduler's wake-ups (completions, preempted threads), or processors wanted
        // elsewhere (see the module): as always.
        return false;
    }
    let p = percpu::this();
    let avg = p.turn_avg.load(Ordering::Relaxed);
    if avg == 0 {
        return false;
    }
    let budget = wake_ticks();
    let queued = u64::from(p.len()) + u64::from(!p.next.ptr.load(Ordering::Relaxed).is_null());
    let so_far = cpu::rdtsc().saturating_sub(p.turn_from.load(Ordering::Relaxed));
    so_far < budget && queued.max(1).saturating_mul(avg) < budget
}

/// Whether `more` threads queued here behind what this vCPU's queue holds start sooner here
/// than on a halted vCPU woken for them (scheduler context: readiness reports).
pub(crate) fn runs_soon_here(more: usize) -> bool {
    let p = percpu::this();
    let queued = u64::from(p.len()) + more as u64;
    if sa::processors_contended() {
        return queued <= CONTENDED_LOCAL_BATCH;
    }
    let avg = p.turn_avg.load(Ordering::Relaxed);
    avg != 0 && queued.saturating_mul(avg) < wake_ticks()
}

/// While other guests take the processors this one gives back, the longest queue a batch of
/// readiness reports fills here before the rest wakes siblings.
const CONTENDED_LOCAL_BATCH: u64 = 32;

/// How long a halted vCPU takes to run after a reschedule IPI (ticks): a moving average (1/8
/// weight) of the measured ones, clamped to [`WAKE_MIN_NS`, `WAKE_MAX_NS`], starting at the
/// cost of getting a processor from the VMM.
static WAKE_TICKS: AtomicU64 = AtomicU64::new(0);
const WAKE_MIN_NS: u64 = 5_000;
const WAKE_MAX_NS: u64 = 2_000_000;

fn wake_ticks() -> u64 {
    match WAKE_TICKS.load(Ordering::Relaxed) {
        0 => cost::acquire_ticks(),
        t => t,
    }
}

/// vCPU `p` ran again at `now` after a halt: if an IPI ended the halt, its latency is a sample.
pub(crate) fn halt_ended(p: &percpu::Pcpu, now: u64) {
    let sent = p.woken_at.swap(0, Ordering::Relaxed);
    if sent == 0 || now <= sent {
        return;
    }
    let sample = (now - sent).clamp(
        percpu::ns_to_ticks(WAKE_MIN_NS),
        percpu::ns_to_ticks(WAKE_MAX_NS),
    );
    let old = WAKE_TICKS.load(Ordering::Relaxed);
    let new = if old == 0 {
        sample
    } else {
        old - old / 8 + sample / 8
    };
    WAKE_TICKS.store(new, Ordering::Relaxed);
}

/// The scheduler switches a thread in at `now` (not a hand-off that inherits the slice): the
/// turn before it, if the vCPU did not idle since, ended.
#[inline]
pub(crate) fn turn_began(p: &percpu::Pcpu, now: u64) {
    let from = p.turn_from.swap(now, Ordering::Relaxed);
    if from != 0 {
        note_turn(p, now.saturating_sub(from));
    }
}

/// The vCPU goes idle at `now`: its turn ended.
pub(crate) fn turn_ended(p: &percpu::Pcpu, now: u64) {
    let from = p.turn_from.swap(0, Ordering::Relaxed);
    if from != 0 {
        note_turn(p, now.saturating_sub(from));
    }
}

/// Adds a turn of `ticks` to the moving average (1/8 weight; turns over the slice count as
/// a slice).
fn note_turn(p: &percpu::Pcpu, ticks: u64) {
    let ticks = ticks.min(crate::config::slice_ticks()).max(1);
    let avg = p.turn_avg.load(Ordering::Relaxed);
    let new = if avg == 0 {
        ticks
    } else {
        avg - avg / 8 + ticks / 8
    };
    p.turn_avg.store(new.max(1), Ordering::Relaxed);
}

/// Forgets vCPU `vcpu`'s idle bits (its activation is gone).
pub fn clear_idle_bits(vcpu: u32) {
    let bit = 1u64 << vcpu;
    SPINNING.fetch_and(!bit, Ordering::AcqRel);
    HALTED.fetch_and(!bit, Ordering::AcqRel);
    sa::set_idle(vcpu, false);
}
