//! How long an idle vCPU spins before it halts: the configured spin (`idle-spin-us`) while its
//! spins have found work often enough to pay for themselves, none while they have not.
//!
//! A spin that finds work saves a halt and the wake-up after it: an exit and an interrupt, about
//! what getting a processor costs (`cost::acquire_ns`, measured). A spin that finds nothing
//! burns its length of processor time that a sibling vCPU or another guest could have used. So
//! spinning `S` pays when it finds work with probability at least `S / (S + C)`. A key-value
//! server whose requests came in batches 300-500 us apart spun before nearly every halt for
//! nothing, a quarter of its host CPU per request (`docs/net.md`); a barrier or a hand-off
//! between vCPUs is found within the spin.
//!
//! Each vCPU keeps the rate at which its full spins found work (a moving average, 1/8 weight,
//! starting at 1: today's behaviour until there is evidence), spins while the rate pays, and
//! spins anyway every [`PROBE_EVERY`]th idle period so the rate follows the workload.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::activation::cost;
use crate::percpu;

/// The hit rate's unit (1.0).
const ONE: u32 = 1 << 16;
/// One idle period in this many spins even while spinning does not pay.
const PROBE_EVERY: u32 = 8;

/// Per vCPU: the rate at which full spins found work, in [`ONE`]ths (0 stands for [`ONE`], the
/// start).
static HIT_RATE: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
/// Per vCPU: idle periods since the last probe while spinning did not pay.
static SKIPPED: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];

fn rate(vcpu: usize) -> u32 {
    match HIT_RATE[vcpu].load(Ordering::Relaxed) {
        0 => ONE,
        r => r,
    }
}

/// The spin for this idle period of `vcpu`, given the configured one (`spin` TSC ticks).
pub(super) fn ticks(vcpu: u32, spin: u64) -> u64 {
    let v = vcpu as usize % HIT_RATE.len();
    if spin == 0 {
        return 0;
    }
    let spin_ns = percpu::ticks_to_ns(spin);
    let pays_from = (u64::from(ONE) * spin_ns / (spin_ns + cost::acquire_ns()).max(1)) as u32;
    if rate(v) >= pays_from {
        return spin;
    }
    // Only this vCPU touches its own counters.
    let skipped = SKIPPED[v].load(Ordering::Relaxed) + 1;
    if skipped >= PROBE_EVERY {
        SKIPPED[v].store(0, Ordering::Relaxed);
        spin
    } else {
        SKIPPED[v].store(skipped, Ordering::Relaxed);
        0
    }
}

/// A full spin of `vcpu` ended: it found work (`hit`) or ran out.
pub(super) fn note(vcpu: u32, hit: bool) {
    let v = vcpu as usize % HIT_RATE.len();
    let old = rate(v);
    let new = if hit {
        old + (ONE - old) / 8
    } else {
        old - old / 8
    };
    HIT_RATE[v].store(new.max(1), Ordering::Relaxed);
}
