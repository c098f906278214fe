//! The counters behind `--stats` ([`GuestStats`]): per-guest counts of upcalls by type,
//! preemptions and the VMM's other interventions, and a bounded sample of its preemption
//! latency (kick until the context is in hand). `report.rs` renders them with the exits and
//! the disk's counters.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// Per-guest counters for `--stats`.
#[derive(Debug, Default)]
pub struct GuestStats {
    /// Upcall records written, by `UpcallKind as usize`.
    pub upcalls: [AtomicU64; 7],
    /// Processors taken away with the context handed to the guest.
    pub preemptions: AtomicU64,
    /// Processors taken away behind the guest's back (oblivious time slicing).
    pub deschedules: AtomicU64,
    /// vCPUs that had to run forward from CPL0 before their context could be taken.
    pub run_forwards: AtomicU64,
    pub yields: AtomicU64,
    /// `sa_yield` offers the VMM declined (the processor kept: nobody else wanted it with I/O in
    /// flight, or a latency-critical guest's last one).
    pub offers_declined: AtomicU64,
    /// `sa_setconcurrency` calls: the guest's asks for processors.
    pub asks: AtomicU64,
    /// Yielded vCPUs whose wake-up time (`sa_yield(wake_ns)`) came before any other grant.
    pub yield_wakes: AtomicU64,
    /// Preemptions deferred because the guest set `defer_preemption`.
    pub deferrals: AtomicU64,
    /// Times a new activation waited for the guest to refill its stack pool.
    pub stack_waits: AtomicU64,
    /// New activations canceled because they lost their processor before running.
    pub canceled: AtomicU64,
    /// Requests that blocked with only the device's latency left, whose vCPU went on at once
    /// as a new activation (`reenter_while_blocked`).
    pub blocked_reentered: AtomicU64,
    /// UNBLOCKED records left pending, without the upcall interrupt (every running vCPU busy).
    pub quiet_unblocked: AtomicU64,
    /// File calls (`fs_read` the page cache could not serve, `fs_fsync`) whose vCPU blocked in
    /// the VMM while the host did them.
    pub file_calls_blocked: AtomicU64,
    /// Socket reports the guest left untaken for `NET_NUDGE` while every vCPU of it ran a
    /// thread, for which a running vCPU was interrupted (`devices/net/unseen.rs`).
    pub socket_reports_nudged: AtomicU64,
    /// Socket reports for a guest holding no processor (`SHARED_FEATURE_YIELD_NET`): it was
    /// made to want one.
    pub socket_reports_woke_guest: AtomicU64,
    /// Kicks of running vCPUs whose queue kept records untaken for `UPCALL_WATCH_BOUND`.
    pub upcall_watch_kicks: AtomicU64,
    /// Upcall interrupts sent again with those kicks.
    pub upcall_interrupts_resent: AtomicU64,
    /// Of those, the vCPUs found with the upcall interrupt requested and deliverable but not
    /// delivered, which KVM was made to look at again (`arch::redeliver_interrupts`).
    pub interrupts_redelivered: AtomicU64,
    /// Of those, the vCPUs KVM held halted with the records still untaken at the next look,
    /// which were woken (`vcpu/redeliver.rs`).
    pub halted_woken: AtomicU64,
    /// Requested interrupts found undelivered by the interrupt watch and made KVM look at
    /// again (`vcpu/nudge.rs`).
    pub interrupts_nudged: AtomicU64,
    /// vCPU threads put at the host's idle priority beside a latency-critical guest, and those
    /// the host refused (`vcpu::enter_host_idle_priority`).
    pub idle_priority_threads: AtomicU64,
    pub idle_priority_refused: AtomicU64,
    /// Kick-to-context-captured delays of preemptions, in TSC ticks (a bounded sample).
    pub preempt_delays: Mutex<Reservoir>,
}

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
