//! Runtime counters, summed over vCPUs (for tests and tuning).

use core::sync::atomic::Ordering;

use activm_stub::println;

use crate::percpu;
use crate::percpu::Counters;

pub use crate::watchdog::{set_report as set_watchdog_report, set_watchdog};

/// Prints the counters when `main` returns.
pub fn set_print_at_exit(on: bool) {
    crate::config::set_print_stats_at_exit(on);
}

/// A snapshot of the counters, summed over all vCPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub switches: u64,
    pub preemptions: u64,
    pub timer_irqs: u64,
    /// Interrupts that found a preemption hold (a spinlock held) and deferred.
    pub deferred_held: u64,
    /// Interrupts that found the scheduler running and deferred.
    pub deferred_sched: u64,
    /// Contexts (interrupted, or from records) rewound out of a restartable sequence.
    pub rseq_rewinds: u64,
    pub steals: u64,
    pub halts: u64,
    /// Processors given back to the VMM idle (`sa_yield`).
    pub idle_yields: u64,
    pub ipis_sent: u64,
    /// Wake-ups kept on the waker's vCPU instead of interrupting a halted one.
    pub wakes_kept: u64,
    pub upcalls: u64,
    pub records: u64,
    /// Lock holders continued until their release.
    pub continuations: u64,
    pub adoptions: u64,
    pub dropped_idle_contexts: u64,
    /// Contexts from records taken while a CPU-exception handler ran.
    pub exception_contexts: u64,
    pub resumed_contexts: u64,
    pub activations: u64,
    /// `Word::Armed` found holding a deadline long past, and cleared.
    pub stale_timer_words: u64,
    /// Upcall records whose sequence number did not increase within their queue.
    pub seq_errors: u64,
    pub heap_stacks: u64,
    pub slots_in_use: u64,
    /// Upcall records handled, by kind (index = `UpcallKind` as u32).
    pub records_by_kind: [u64; 7],
}

/// Sums the counters of every vCPU.
pub fn snapshot() -> Stats {
    let mut s = Stats::default();
    for p in percpu::pcpus() {
        let c: &Counters = &p.counters;
        let get = |a: &core::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        s.switches += get(&c.switches);
        s.preemptions += get(&c.preemptions);
        s.timer_irqs += get(&c.timer_irqs);
        s.deferred_held += get(&c.deferred_held);
        s.deferred_sched += get(&c.deferred_sched);
        s.rseq_rewinds += get(&c.rseq_rewinds);
        s.steals += get(&c.steals);
        s.halts += get(&c.halts);
        s.idle_yields += get(&c.idle_yields);
        s.ipis_sent += get(&c.ipis_sent);
        s.wakes_kept += get(&c.wakes_kept);
        s.upcalls += get(&c.upcalls);
        s.records += get(&c.records);
        s.continuations += get(&c.continuations);
        s.adoptions += get(&c.adoptions);
        s.dropped_idle_contexts += get(&c.dropped_idle_contexts);
        s.exception_contexts += get(&c.exception_contexts);
        s.resumed_contexts += get(&c.resumed_contexts);
        s.activations += get(&c.activations);
        s.stale_timer_words += get(&c.stale_timer_words);
    }
    s.seq_errors = crate::upcall::SEQ_ERRORS.load(Ordering::Relaxed);
    s.heap_stacks = u64::from(crate::stack::HEAP_STACKS.load(Ordering::Relaxed));
    s.slots_in_use = crate::stack::slots_in_use();
    for (i, k) in crate::upcall::BY_KIND.iter().enumerate() {
        s.records_by_kind[i] = k.load(Ordering::Relaxed);
    }
    s
}

/// Prints the counters on the console.
pub fn print() {
    let s = snapshot();
    println!("activm-rt stats: {s:?}");
    if crate::upcall::activations_enabled() {
        println!(
            "activm-rt: a processor from the VMM takes {} us here (measured)",
            crate::upcall::cost::acquire_ns() / 1000
        );
    }
}

/// Prints every vCPU's runtime words and queues (diagnostics: SIGQUIT).
pub fn dump() {
    use crate::arch::cpu::{self, Word};
    for (v, p) in percpu::pcpus().iter().enumerate() {
        let v = v as u32;
        let (hold, pending) = (cpu::hold_of(v), cpu::pending_of(v));
        println!(
            "activm-rt: vCPU {v}: activation {} in_sched {} idle {} current {:#x} hold {hold} pending {pending:#x} armed {} runq {} switches {} records {}",
            cpu::get_of(v, Word::Activation),
            cpu::get_of(v, Word::InSched),
            cpu::get_of(v, Word::SchedIdle),
            cpu::get_of(v, Word::Current),
            cpu::get_of(v, Word::Armed) != 0,
            p.len(),
            p.counters.switches.load(Ordering::Relaxed),
            p.counters.records.load(Ordering::Relaxed),
        );
    }
    cpu::print_interrupt_state();
    crate::sched::dump();
    crate::upcall::dump();
    crate::percpu::print_trace_last(64);
    println!("activm-rt stats: {:?}", snapshot());
}
