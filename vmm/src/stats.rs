//! `--stats`: per-guest counts of upcalls by type, preemptions, exits by reason, and the
//! distribution of the VMM's preemption latency (kick until the context is in hand).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use protocol::shared::UpcallKind;

use crate::activation::upcall_name;
use crate::guest::Guest;

/// A uniform sample of at most [`Reservoir::CAPACITY`] values out of all pushed (Vitter's
/// algorithm R), so a long run's latency statistics take bounded memory.
#[derive(Clone, Debug, Default)]
pub struct Reservoir {
    samples: Vec<u64>,
    seen: u64,
    rng: u64,
}

impl Reservoir {
    pub const CAPACITY: usize = 4096;

    pub fn push(&mut self, value: u64) {
        self.seen += 1;
        if self.samples.len() < Self::CAPACITY {
            self.samples.push(value);
            return;
        }
        // xorshift64, seeded by the count: statistics, not security.
        let mut x = (self.rng ^ self.seen.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let slot = x % self.seen;
        if (slot as usize) < Self::CAPACITY {
            self.samples[slot as usize] = value;
        }
    }

    pub fn samples(&self) -> &[u64] {
        &self.samples
    }

    /// How many values were pushed in all.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

/// Median and 99th percentile of `samples` (sorted in place).
pub fn median_p99(samples: &mut [u64]) -> Option<(u64, u64)> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.99)))
}

pub fn render(guest: &Guest) -> String {
    let s = &guest.stats;
    let mut out = String::new();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let _ = write!(out, "upcalls:");
    for kind in [
        UpcallKind::NewProc,
        UpcallKind::Preempted,
        UpcallKind::Blocked,
        UpcallKind::Unblocked,
        UpcallKind::Signal,
        UpcallKind::User,
    ] {
        let _ = write!(
            out,
            " {}={}",
            upcall_name(kind).trim_start_matches("upcall "),
            n(&s.upcalls[kind as usize])
        );
    }
    let view = guest.procs.alloc.view(guest.id);
    let _ = write!(
        out,
        "\npreemptions with hand-off={} descheduled (oblivious)={} run forward from CPL0={} yields={} (woken for a timer by its own thread={}, by another guest's running vCPU={}; found redundant, their sleepers awake: moved to a later sleeper={}, dropped={}) deferred={} waits for an upcall stack={} canceled activations={} vCPU threads moved to their processor's host CPU (all guests)={} (placement widened for a late start={}) upcall watchdog kicks={} (undelivered upcall interrupts redelivered={}, halted vCPUs woken={})",
        n(&s.preemptions),
        n(&s.deschedules),
        n(&s.run_forwards),
        n(&s.yields),
        n(&s.yield_wakes),
        view.wakes_fired,
        view.wakes_moved,
        view.wakes_dropped,
        n(&s.deferrals),
        n(&s.stack_waits),
        n(&s.canceled),
        guest.procs.alloc.rebinds(),
        guest.procs.alloc.placement_widenings(),
        n(&s.upcall_watch_kicks),
        n(&s.interrupts_redelivered),
        n(&s.halted_woken)
    );
    let _ = write!(
        out,
        "\nblocked with a new activation on the same vCPU={} UNBLOCKED left pending without an interrupt (every running vCPU busy)={}",
        n(&s.blocked_reentered),
        n(&s.quiet_unblocked)
    );
    let _ = write!(
        out,
        "\ninterrupt watch: undelivered interrupts redelivered={}",
        n(&s.interrupts_nudged)
    );
    let (mut delays, seen) = {
        let reservoir = s.preempt_delays.lock().unwrap_or_else(|e| e.into_inner());
        (reservoir.samples().to_vec(), reservoir.seen())
    };
    if let Some((median, p99)) = median_p99(&mut delays) {
        let us = |t: u64| t as f64 * 1000.0 / guest.tsc_khz.max(1) as f64;
        let _ = write!(
            out,
            "\npreemption latency (kick to context in hand): median {:.1} us, p99 {:.1} us, n={seen}{}",
            us(median),
            us(p99),
            if seen > delays.len() as u64 {
                format!(" (from a uniform sample of {})", delays.len())
            } else {
                String::new()
            }
        );
    }
    let (mut hypercalls, mut kicks, mut other) = (0, 0, 0);
    for v in &guest.vcpus {
        hypercalls += v.exits[crate::kick::EXIT_HYPERCALL].load(Ordering::Relaxed);
        kicks += v.exits[crate::kick::EXIT_KICK].load(Ordering::Relaxed);
        other += v.exits[crate::kick::EXIT_OTHER].load(Ordering::Relaxed);
    }
    let _ = write!(
        out,
        "\nexits: hypercall={hypercalls} kick={kicks} other={other}"
    );
    if let Some((dropped, skipped)) = guest.timeline.as_ref().and_then(|t| t.losses()) {
        let _ = write!(
            out,
            "\ntrace timeline: events dropped (guest ring full)={dropped} skipped (malformed)={skipped}"
        );
    }
    if let Some(line) = crate::arch::current::register_transfer_stats() {
        let _ = write!(out, "\n{line}");
    }
    if let Some(disk) = &guest.disk {
        let d = &disk.stats;
        let blocking = n(&d.blocking);
        let _ = write!(
            out,
            "\ndisk {}: reads={} writes={} flushes={} bytes={} completed in the exit={} (waited for the device there={}) asynchronous={} blocked the vCPU={} (mean {:.0} us) from the submission ring={} consumer wake-ups={}; completions posted at exits={} by a polling vCPU={} by the timer thread={} (its wake-ups={}) by I/O threads={} when taken from the submission ring={}",
            disk.path().display(),
            n(&d.reads),
            n(&d.writes),
            n(&d.flushes),
            n(&d.bytes),
            n(&d.immediate),
            n(&d.waited_inline),
            n(&d.asynchronous),
            blocking,
            n(&d.blocked_us) as f64 / blocking.max(1) as f64,
            n(&d.ring_submitted),
            n(&d.consumer_wakeups),
            n(&d.posted_at_exits),
            n(&d.posted_by_poller),
            n(&d.posted_by_timer),
            n(&d.timer_wakeups),
            n(&d.posted_by_io),
            n(&d.posted_when_taken)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let mut v: Vec<u64> = (1..=100).collect();
        assert_eq!(super::median_p99(&mut v), Some((51, 99)));
        assert_eq!(super::median_p99(&mut []), None);
    }

    #[test]
    fn the_reservoir_stays_bounded_and_representative() {
        let mut r = super::Reservoir::default();
        for v in 0..1_000_000u64 {
            r.push(v);
        }
        assert_eq!(r.seen(), 1_000_000);
        assert_eq!(r.samples().len(), super::Reservoir::CAPACITY);
        let mut s = r.samples().to_vec();
        let (median, _) = super::median_p99(&mut s).unwrap();
        assert!((400_000..600_000).contains(&median), "{median}");
    }
}
