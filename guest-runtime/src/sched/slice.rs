//! Time slices: the timer is armed only when it has a purpose (another thread waits for this
//! vCPU, or a sleeper is due) and at most once per slice; voluntary switches never touch it.

use core::sync::atomic::Ordering;

use activm_stub::preempt;

use super::{current_raw, runnable_elsewhere};
use crate::alarm::{self, ensure_armed_by, EARLIEST, SLEEP_EARLY_NS};
use crate::arch::cpu::{self, Word};
use crate::config;
use crate::percpu::{self, ns_to_ticks};
use crate::tcb;

/// The deadline the timer should fire at for the thread switched in at `slice_start`.
pub(crate) fn wanted_deadline(slice_start: u64) -> Option<u64> {
    let mut deadline = u64::MAX;
    if let Some((min, max)) = config::random_preemption() {
        let span = max.saturating_sub(min).max(1);
        let ns = min + percpu::this().random() % span;
        // (`rdtsc` only here: it costs ~15 ns, on every switch-in otherwise.)
        deadline = cpu::rdtsc() + ns_to_ticks(ns);
    } else if runnable_elsewhere() {
        deadline = slice_start + config::slice_ticks();
    }
    let earliest = EARLIEST.load(Ordering::Acquire);
    if earliest != u64::MAX {
        deadline = deadline.min(earliest.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    }
    (deadline != u64::MAX).then_some(deadline)
}

/// Scheduler, about to switch in a thread at `now`.
pub(super) fn on_switch_in(now: u64) {
    if let Some(deadline) = wanted_deadline(now) {
        ensure_armed_by(deadline);
    }
}

/// Thread context, after making a thread runnable here: the running thread's slice must end.
pub(super) fn ensure_slice_timer() {
    let armed = cpu::get(Word::Armed);
    if armed != 0 && !cpu::timer_stopped() && cpu::rdtsc() <= armed + alarm::stale_armed_ticks() {
        return;
    }
    let hold = preempt::Hold::new();
    let cur = current_raw();
    if !cur.is_null() && alarm::armed_deadline() == 0 {
        // SAFETY: the running thread's TCB.
        let start = unsafe { tcb::from_raw(cur) }
            .slice_start
            .load(Ordering::Relaxed);
        ensure_armed_by(start + config::slice_ticks());
    }
    drop(hold);
}
