//! This vCPU's local APIC one-shot timer: arming it for a TSC deadline, at most once (an
//! APIC access costs an exit into KVM, ~6.5 us here). `Word::Armed` remembers the deadline it
//! is armed for. Also the earliest sleeper's deadline, which every arming policy looks at (the
//! time slice in `sched::slice`, the sleepers in `timer`).

use core::sync::atomic::AtomicU64;

use activm_stub::preempt;

use crate::arch::cpu::{self, Word};
use crate::percpu::{self, ticks_to_ns};

/// The shortest timer period worth programming.
pub(crate) const MIN_ARM_NS: u64 = 5_000;
/// How early the timer is armed for a sleeper (it fires ~40 us late on our hosts).
pub(crate) const SLEEP_EARLY_NS: u64 = 50_000;

/// The earliest sleeper deadline (TSC), or `u64::MAX` (written by `timer`).
pub(crate) static EARLIEST: AtomicU64 = AtomicU64::new(u64::MAX);

/// Arms this vCPU's timer to interrupt by TSC `deadline` at the latest (the watchdog's hook:
/// it calls from a timer interrupt or a scheduler or lock-wait loop, this vCPU pinned).
pub(crate) fn arm_by(deadline: u64) {
    ensure_armed_by(deadline);
}

/// Arms this vCPU's timer for TSC `deadline` unless it is armed for an earlier one. Call with
/// this vCPU pinned (scheduler context or a preemption hold).
pub(crate) fn ensure_armed_by(deadline: u64) {
    let armed = armed_deadline();
    if armed != 0 && armed <= deadline {
        return;
    }
    let now = cpu::rdtsc();
    let ns = ticks_to_ns(deadline.saturating_sub(now)).max(MIN_ARM_NS);
    percpu::trace(percpu::T_ARM, ns);
    cpu::set(Word::Armed, deadline.max(now + 1));
    cpu::arm_timer_ns(ns);
}

/// The deadline this vCPU's timer is armed for (0: not armed). `Word::Armed` says, unless the
/// timer itself is known to be stopped (`cpu::timer_stopped`: aarch64 reads its control
/// register, no exit). On aarch64 the word was seen left set over a timer the EL1 stub had
/// masked (about 120 times in 30 runs of `rt-tests blk-overlap`; cause not found): the vCPU
/// then never took a timer interrupt again, and a third of those runs hung.
///
/// A deadline the word still holds [`STALE_ARMED_MS`] after it passed is stale too: its
/// interrupt came and went without clearing it (`on_timer` clears the word of the vCPU it runs
/// on, which a nested interrupt after the trampoline's EOI may have moved its thread to). A
/// stale word in the past made every later `ensure_armed_by` believe an earlier deadline was
/// armed: that vCPU never armed its timer again, and halted over its sleepers. Clearing it
/// costs at worst one extra timer interrupt when the real one is merely late.
pub(crate) fn armed_deadline() -> u64 {
    let armed = cpu::get(Word::Armed);
    if armed != 0 && (cpu::timer_stopped() || stale(armed)) {
        cpu::set(Word::Armed, 0);
        return 0;
    }
    armed
}

/// How long past its deadline `Word::Armed` may still hold it before it is taken as stale.
/// The timer fires ~40 us late on our hosts; a vCPU whose host thread waits for a CPU takes it
/// when it runs again, before any of its code can look at the word.
const STALE_ARMED_MS: u64 = 2;

/// [`STALE_ARMED_MS`] in TSC ticks: a multiplication (`ns_to_ticks`'s 128-bit division costs
/// tens of nanoseconds, on every thread made runnable through `ensure_slice_timer`).
pub(crate) fn stale_armed_ticks() -> u64 {
    percpu::tsc_khz() * STALE_ARMED_MS
}

/// Whether `armed`, the word's deadline, is stale (see [`armed_deadline`]); counts it.
fn stale(armed: u64) -> bool {
    let stale = cpu::rdtsc() > armed.saturating_add(stale_armed_ticks());
    if stale {
        percpu::bump(&percpu::this().counters.stale_timer_words);
    }
    stale
}

/// Makes sure this vCPU's timer ticks by TSC `deadline` (a backlog's ask delay ends then).
pub fn tick_by(deadline: u64) {
    let hold = preempt::Hold::new();
    ensure_armed_by(deadline);
    drop(hold);
}

/// Scheduler, before halting idle: wake up at TSC `deadline` at the latest.
pub fn arm_idle_deadline(deadline: u64) {
    ensure_armed_by(deadline);
}
