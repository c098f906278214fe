//! The report of a run: how each guest ended, its boot timing, exits and counters.

use std::sync::atomic::Ordering;

use protocol::boot::VcpuBoot;

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
    /// What the guest looked like when the VMM stopped it (`hang.rs`), if it did.
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
            stats: crate::stats::render(guest),
            hang: guest.hang_report(),
        }
    }
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
