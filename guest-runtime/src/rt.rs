//! Low-level access for tests and benchmarks: the vCPU a thread runs on, the TSC, the
//! restartable-sequence probe, preemption holds.

use crate::arch::cpu;
use crate::arch::rseq;
use crate::percpu;

pub use activm_stub::preempt::{hold, release};
pub use activm_stub::sync::{SpinGuard, SpinLock};

/// The vCPU this code runs on right now (it may change at any preemption).
#[inline]
pub fn vcpu() -> u32 {
    activm_stub::vcpu_id()
}

/// Number of vCPUs.
pub fn nr_vcpus() -> u32 {
    crate::percpu::nr_vcpus()
}

/// The time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    cpu::rdtsc()
}

/// TSC frequency in kHz.
pub fn tsc_khz() -> u64 {
    crate::percpu::tsc_khz()
}

/// Nanoseconds between two TSC readings.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    crate::timer::ticks_to_ns(ticks)
}

/// Adds one to the running vCPU's probe counter inside a restartable sequence whose body
/// spins `spins` times (interruptions there are rewound).
pub fn probe_increment(spins: u64) {
    rseq::probe_increment(spins);
}

/// The sum of every vCPU's probe counter.
pub fn probe_total() -> u64 {
    crate::percpu::pcpus()
        .iter()
        .map(|p| p.probe.load(core::sync::atomic::Ordering::Relaxed))
        .sum()
}

/// Whether the restartable-sequence table has an entry covering `pc` (tests).
pub fn in_rseq(pc: u64) -> bool {
    rseq::fixup(pc).is_some()
}

/// Threads in this vCPU's run queue (a snapshot).
pub fn local_queue_len() -> u32 {
    percpu::this().len()
}
