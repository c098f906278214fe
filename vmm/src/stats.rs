//! `--stats`: per-guest counts of upcalls by type, preemptions, exits by reason, and the
//! distribution of the VMM's preemption latency (kick until the context is in hand).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use protocol::shared::UpcallKind;

use crate::activation::upcall_name;
use crate::guest::Guest;

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
    let _ = write!(
        out,
        "\npreemptions with hand-off={} descheduled (oblivious)={} run forward from CPL0={} yields={} deferred={} waits for an upcall stack={} canceled activations={}",
        n(&s.preemptions),
        n(&s.deschedules),
        n(&s.run_forwards),
        n(&s.yields),
        n(&s.deferrals),
        n(&s.stack_waits),
        n(&s.canceled)
    );
    let mut delays = s
        .preempt_delays
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((median, p99)) = median_p99(&mut delays) {
        let us = |t: u64| t as f64 * 1000.0 / guest.tsc_khz.max(1) as f64;
        let _ = write!(
            out,
            "\npreemption latency (kick to context in hand): median {:.1} us, p99 {:.1} us, n={}",
            us(median),
            us(p99),
            delays.len()
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
    if let Some(line) = crate::arch::current::register_transfer_stats() {
        let _ = write!(out, "\n{line}");
    }
    if let Some(disk) = &guest.disk {
        let d = &disk.stats;
        let blocking = n(&d.blocking);
        let _ = write!(
            out,
            "\ndisk {}: reads={} writes={} flushes={} bytes={} completed in the exit={} asynchronous={} blocked the vCPU={} (mean {:.0} us)",
            disk.path().display(),
            n(&d.reads),
            n(&d.writes),
            n(&d.flushes),
            n(&d.bytes),
            n(&d.immediate),
            n(&d.asynchronous),
            blocking,
            n(&d.blocked_us) as f64 / blocking.max(1) as f64
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
}
