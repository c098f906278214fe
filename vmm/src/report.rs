//! The report of a run: how each guest ended, its boot timing, exits and counters.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use protocol::boot::VcpuBoot;
use protocol::shared::UpcallKind;

use crate::activation::upcall_name;
use crate::arch::current as arch;
use crate::guest::Guest;
use crate::vm::Outcome;

/// Boot milestones in host TSC ticks.
#[derive(Clone, Debug)]
pub struct BootTiming {
    pub tsc_khz: u64,
    pub process_start: u64,
    /// VMM milestones in order: (what was done, TSC when it was).
    pub phases: Vec<(&'static str, u64)>,
    /// Per vCPU: first guest instruction and arrival in the guest's main code (0 = not reached).
    pub vcpus: Vec<(u64, u64)>,
}

impl BootTiming {
    /// Microseconds from process start to `tsc` (NaN if never reached).
    pub fn us_since_start(&self, tsc: u64) -> f64 {
        if tsc < self.process_start || tsc == 0 {
            return f64::NAN;
        }
        (tsc - self.process_start) as f64 * 1000.0 / self.tsc_khz as f64
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "boot timing (us from activm start, TSC {} kHz):\n",
            self.tsc_khz
        );
        for (what, tsc) in &self.phases {
            out += &format!("  {what:<32} {:10.1}\n", self.us_since_start(*tsc));
        }
        for (i, (first, main)) in self.vcpus.iter().enumerate() {
            out += &format!(
                "  vCPU {i}: first guest instruction {:10.1}, guest main {:10.1}\n",
                self.us_since_start(*first),
                self.us_since_start(*main)
            );
        }
        out
    }
}

/// The result of running one guest.
#[derive(Debug)]
pub struct RunReport {
    pub name: String,
    pub outcome: Outcome,
    pub timing: Option<BootTiming>,
    /// Exits handled per vCPU: (hypercalls, kicks, other).
    pub exits: Vec<(usize, usize, usize)>,
    /// `--stats`: upcalls by kind name, preemptions and the other counters, printable.
    pub stats: String,
    /// What the guest looked like when the VMM stopped it (`hang/`), if it did.
    pub hang: Option<String>,
}

impl RunReport {
    pub fn new(outcome: Outcome, timing: Option<BootTiming>, guest: &Guest) -> RunReport {
        let exits = guest
            .vcpus
            .iter()
            .map(|v| {
                let n = |i: usize| v.exits[i].load(Ordering::Relaxed);
                (
                    n(crate::kick::EXIT_HYPERCALL),
                    n(crate::kick::EXIT_KICK),
                    n(crate::kick::EXIT_OTHER),
                )
            })
            .collect();
        RunReport {
            name: guest.name.clone(),
            outcome,
            timing,
            exits,
            stats: render_stats(guest),
            hang: guest.hang_report(),
        }
    }
}

/// `--stats`: the guest's counters (`stats.rs`), exits and disk counters, printable.
fn render_stats(guest: &Guest) -> String {
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
        "\npreemptions with hand-off={} descheduled (oblivious)={} run forward from CPL0={} yields={} (woken for a timer by its own thread={}, by another guest's running vCPU={}; found redundant, their sleepers awake: moved to a later sleeper={}, dropped={}) deferred={} waits for an upcall stack={} canceled activations={} vCPU threads moved to their processor's host CPU (all guests)={} (placement widened for a late start={}) upcall watchdog kicks={} (upcall interrupts sent again={}, undelivered upcall interrupts redelivered={}, halted vCPUs woken={})",
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
        n(&s.upcall_interrupts_resent),
        n(&s.interrupts_redelivered),
        n(&s.halted_woken)
    );
    let _ = write!(
        out,
        "\nblocked with a new activation on the same vCPU={} UNBLOCKED left pending without an interrupt (every running vCPU busy)={} slow file calls (vCPU blocked)={} socket reports nudged to a busy vCPU={} socket reports that asked for a processor={}",
        n(&s.blocked_reentered),
        n(&s.quiet_unblocked),
        n(&s.file_calls_blocked),
        n(&s.socket_reports_nudged),
        n(&s.socket_reports_woke_guest)
    );
    let _ = write!(
        out,
        "\nprocessor offers declined={} asks for processors (sa_setconcurrency)={}",
        n(&s.offers_declined),
        n(&s.asks)
    );
    let _ = write!(
        out,
        "\ninterrupt watch: undelivered interrupts redelivered={}",
        n(&s.interrupts_nudged)
    );
    let (idle, refused) = (n(&s.idle_priority_threads), n(&s.idle_priority_refused));
    if idle + refused > 0 {
        let _ = write!(
            out,
            "\nvCPU threads at the host's idle priority (beside a latency-critical guest)={idle} refused by the host={refused}"
        );
    }
    let (mut delays, seen) = {
        let reservoir = s.preempt_delays.lock().unwrap_or_else(|e| e.into_inner());
        (reservoir.samples().to_vec(), reservoir.seen())
    };
    if let Some((median, p99)) = crate::stats::median_p99(&mut delays) {
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

/// The boot milestones of `guest`: the VMM's phases, then when each vCPU reached its first
/// instruction and the guest's main code (the guest writes those into `BootInfo`).
pub fn boot_timing(guest: &Guest, threads_started: u64) -> BootTiming {
    let mut phases = guest.phases.clone();
    phases.push(("vCPU threads started", threads_started));
    let vcpus_field = std::mem::offset_of!(protocol::boot::BootInfo, vcpus) as u64;
    let vcpus = (0..guest.config.vcpus as u64)
        .map(|i| {
            let at = arch::layout::BOOT_INFO_ADDR
                + vcpus_field
                + i * std::mem::size_of::<VcpuBoot>() as u64;
            let first = guest
                .ram
                .read_u64(at + std::mem::offset_of!(VcpuBoot, first_insn_tsc) as u64);
            let main = guest
                .ram
                .read_u64(at + std::mem::offset_of!(VcpuBoot, main_tsc) as u64);
            (first.unwrap_or(0), main.unwrap_or(0))
        })
        .collect();
    BootTiming {
        tsc_khz: guest.tsc_khz,
        process_start: guest.config.start_tsc,
        phases,
        vcpus,
    }
}
