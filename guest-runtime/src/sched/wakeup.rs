//! Idle vCPUs' bits (spinning for work, halted) and waking one when work appears (Go's
//! `wakep`): a reschedule IPI to a halted vCPU, or, when none idles here and some gave their
//! processors back to the VMM, an ask for them (`activation::sa::want_processors`). How a
//! vCPU idles is `dispatch::idle`'s.

use core::sync::atomic::{fence, AtomicU64, Ordering};

use activm_stub::preempt;

use crate::activation::sa;
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
    let v = halted.trailing_zeros();
    let bit = 1u64 << v;
    if HALTED.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
        let hold = preempt::Hold::new();
        cpu::send_ipi(percpu::of(v).apic_id, RESCHEDULE_IRQ);
        percpu::bump(&percpu::this().counters.ipis_sent);
        drop(hold);
    }
}

/// Forgets vCPU `vcpu`'s idle bits (its activation is gone).
pub fn clear_idle_bits(vcpu: u32) {
    let bit = 1u64 << vcpu;
    SPINNING.fetch_and(!bit, Ordering::AcqRel);
    HALTED.fetch_and(!bit, Ordering::AcqRel);
    sa::set_idle(vcpu, false);
}
