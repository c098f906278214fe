//! What a processor costs here: how long getting one from the VMM takes, measured, and the
//! idle and asking rules derived from it.
//!
//! A processor given back and asked for again moves through the VMM: a kick of whoever holds
//! it (maybe another guest, which gets a PREEMPTED record), a new activation here. On our
//! hosts that took 40-400 us, depending on the host and its load. Fixed thresholds tuned on
//! one host thrashed on another: a server beside a batch guest gave its processor back for
//! 100 us gaps and took it back at once, two transfers per request, and the batch guest
//! beside it ran at a tenth of its speed (`cargo xtask bench latency`).
//!
//! So the rules are those of renting versus buying skis (Karlin et al.'s competitive
//! spinning), with the cost `C` measured as the guest sees it, from asking (`sa_setconcurrency`)
//! or from the wake-up time a timed `sa_yield` asked for, to the new activation taking its
//! NEWPROC record:
//! - the guest's last running vCPU gives its processor back for a sleeper only if the gap is
//!   at least `2C` (out and back in); it asks to be back `C` before the sleeper is due;
//! - work that waits with no idle vCPU asks for a processor only once it has waited `C`: a
//!   busy vCPU usually frees itself within that (a thread blocks or ends), and if not, the
//!   ask costs what the wait did.
//!
//! The estimate is a moving average (1/8 weight) of samples clamped to [`MIN_NS`, `MAX_NS`];
//! it starts at [`INITIAL_NS`]. It is kept in TSC ticks (`ask_delay_ticks` is read on wake-ups;
//! converting would cost a 128-bit division each time).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::arch::cpu;
use crate::percpu;

/// The estimate before any sample (the old fixed lead, 60 us, and minimum gap, 100 us, were
/// tuned on a host where a transfer cost about this much).
const INITIAL_NS: u64 = 60_000;
/// Samples are clamped to this range: a grant can wait for other reasons (the budget was
/// busy with a latency-critical guest, the host descheduled the thread), which is not the
/// cost of a transfer.
const MIN_NS: u64 = 10_000;
const MAX_NS: u64 = 1_000_000;

/// The estimate of `C`, in TSC ticks (0: none yet, [`INITIAL_NS`]).
static ACQUIRE_TICKS: AtomicU64 = AtomicU64::new(0);
/// When this guest last asked for processors (TSC; 0: no ask outstanding).
static ASKED_AT: AtomicU64 = AtomicU64::new(0);
/// Per vCPU: the TSC a timed `sa_yield` asked to be back at (0: none).
static WAKE_DUE: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The measured cost of getting a processor, in TSC ticks.
pub(crate) fn acquire_ticks() -> u64 {
    match ACQUIRE_TICKS.load(Ordering::Relaxed) {
        0 => percpu::ns_to_ticks(INITIAL_NS),
        t => t,
    }
}

/// The measured cost of getting a processor, in ns.
pub fn acquire_ns() -> u64 {
    percpu::ticks_to_ns(acquire_ticks())
}

/// How long before a sleeper is due a processor given back should be asked back.
pub fn yield_lead_ns() -> u64 {
    acquire_ns()
}

/// The shortest gap to a sleeper for which the last running vCPU gives its processor back.
pub fn yield_min_gap_ns() -> u64 {
    2 * acquire_ns()
}

/// How long work waits with no idle vCPU before the guest asks for a processor, in TSC ticks.
pub fn ask_delay_ticks() -> u64 {
    acquire_ticks()
}

/// The guest asks for processors now.
pub fn note_ask() {
    let _ = ASKED_AT.compare_exchange(0, cpu::rdtsc().max(1), Ordering::AcqRel, Ordering::Relaxed);
}

/// vCPU `vcpu` gives its processor back, asking to be back `wake_ns` from now (0: not timed,
/// or the VMM kept the processor after all).
pub fn note_timed_yield(vcpu: u32, wake_ns: u64) {
    if let Some(due) = WAKE_DUE.get(vcpu as usize) {
        let at = if wake_ns == 0 {
            0
        } else {
            cpu::rdtsc() + percpu::ns_to_ticks(wake_ns)
        };
        due.store(at, Ordering::Relaxed);
    }
}

/// A new activation on `vcpu` took its NEWPROC record: one sample of `C`, if an ask or a
/// timed yield of that vCPU was waiting for it.
pub fn note_new_activation(vcpu: u32) {
    let now = cpu::rdtsc();
    let asked = ASKED_AT.swap(0, Ordering::AcqRel);
    let due = WAKE_DUE
        .get(vcpu as usize)
        .map_or(0, |d| d.swap(0, Ordering::Relaxed));
    let since = match (asked, due) {
        (0, 0) => return,
        (0, d) | (d, 0) => d,
        (a, d) => a.max(d),
    };
    let sample = now
        .saturating_sub(since)
        .clamp(percpu::ns_to_ticks(MIN_NS), percpu::ns_to_ticks(MAX_NS));
    let old = acquire_ticks();
    // Two vCPUs may update at once; one sample lost is harmless.
    ACQUIRE_TICKS.store(old - old / 8 + sample / 8, Ordering::Relaxed);
}
