//! What a guest is asked to be (`VmConfig`), how it ended (`Outcome`), and the report of a run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::boot::VcpuBoot;

use crate::arch::current as arch;
use crate::config::Key;
use crate::error::Error;
use crate::guest::Guest;
use crate::monitor::{run_guests, MonitorOptions};

/// Exit status when the guest panicked.
pub const EXIT_GUEST_PANIC: i32 = 101;
/// Exit status when the guest faulted or broke the protocol.
pub const EXIT_GUEST_FAULT: i32 = 125;
/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;

/// What to run.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub image: PathBuf,
    /// The guest's label in console prefixes, `--stats`, `activm ctl` and traces (default: the
    /// image's file name, made unique).
    pub name: Option<String>,
    pub vcpus: u32,
    pub mem_size: u64,
    pub args: Vec<String>,
    pub boot_timing: bool,
    pub timeout: Option<Duration>,
    /// Host TSC at process start, for boot timing.
    pub start_tsc: u64,
    /// Usable bytes of each guard-paged thread stack, and how many (default: a quarter of RAM).
    pub thread_stack_size: u64,
    pub thread_stacks: Option<u32>,
    /// The guest's block device, if any.
    pub disk: Option<crate::devices::blk::DiskConfig>,
    /// Whether this guest may use scheduler activations (`--no-activations`, or
    /// `no_activations` in a configuration file, clears it). Guests with and without share one
    /// budget of processors; `MonitorOptions::activations` turns them off for every guest.
    pub activations: bool,
}

impl VmConfig {
    /// A configuration with activm's defaults for everything but the image.
    pub fn new(image: impl Into<PathBuf>) -> VmConfig {
        VmConfig {
            image: image.into(),
            name: None,
            vcpus: 1,
            mem_size: crate::config::DEFAULT_MEM,
            args: Vec::new(),
            boot_timing: false,
            timeout: None,
            start_tsc: crate::rdtsc(),
            thread_stack_size: DEFAULT_THREAD_STACK,
            thread_stacks: None,
            disk: None,
            activations: true,
        }
    }

    /// Check the settings that do not depend on the image or the host: the vCPU count, the
    /// RAM size, the thread stack size and the disk's latency. The error names the setting and
    /// says what is wrong with it, for the caller to put in its own words (a flag or a key).
    pub fn check(&self) -> Result<(), (Key, String)> {
        if self.vcpus == 0 || self.vcpus as usize > protocol::MAX_VCPUS {
            return Err((
                Key::Vcpus,
                format!(
                    "must be between 1 and {}, not {}",
                    protocol::MAX_VCPUS,
                    self.vcpus
                ),
            ));
        }
        if !self.mem_size.is_multiple_of(2 << 20) || self.mem_size > arch::abi::RAM_LIMIT {
            return Err((
                Key::Mem,
                format!(
                    "must be a multiple of 2 MiB and at most {} MiB",
                    arch::abi::RAM_LIMIT >> 20
                ),
            ));
        }
        if !crate::memory::THREAD_STACK_SIZES.contains(&self.thread_stack_size) {
            return Err((Key::ThreadStack, "must be between 4K and 64M".into()));
        }
        if let Some(disk) = &self.disk {
            if disk.latency > crate::devices::blk::MAX_LATENCY {
                return Err((
                    Key::IoLatency,
                    format!(
                        "is at most {} us",
                        crate::devices::blk::MAX_LATENCY.as_micros()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Usable bytes of a thread stack unless `--thread-stack` says otherwise.
pub const DEFAULT_THREAD_STACK: u64 = 124 * 1024;

/// How a guest ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest called `exit(code)`.
    Exited(i32),
    /// The guest panicked with this message.
    Panicked { vcpu: u32, message: String },
    /// The guest faulted or broke the protocol; `report` says how, with registers.
    Fault { vcpu: u32, report: String },
    /// Every vCPU stopped without the guest calling `exit`.
    AllStopped,
    /// `--timeout` expired.
    TimedOut(Duration),
    /// Stopped by a host signal (SIGINT, SIGTERM) it could not take as an upcall, or a second one.
    Signaled(i32),
}

impl Outcome {
    pub fn fault(vcpu: u32, report: String) -> Outcome {
        Outcome::Fault { vcpu, report }
    }

    /// The process exit status this outcome maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(code) => *code,
            Outcome::Panicked { .. } => EXIT_GUEST_PANIC,
            Outcome::Fault { .. } | Outcome::AllStopped => EXIT_GUEST_FAULT,
            Outcome::TimedOut(_) => EXIT_TIMEOUT,
            Outcome::Signaled(signal) => 128 + signal,
        }
    }

    /// A message for stderr, if the outcome is not a plain exit.
    pub fn describe(&self) -> Option<String> {
        match self {
            Outcome::Exited(_) => None,
            Outcome::Panicked { vcpu, message } => {
                Some(format!("guest panicked on vCPU {vcpu}: {message}"))
            }
            Outcome::Fault { report, .. } => Some(format!("guest fault: {report}")),
            Outcome::AllStopped => Some("every vCPU stopped without the guest calling exit".into()),
            Outcome::TimedOut(after) => Some(format!(
                "guest still running after the {after:?} timeout; stopped"
            )),
            Outcome::Signaled(signal) => Some(format!("guest stopped by signal {signal}")),
        }
    }
}

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
}

impl RunReport {
    pub fn new(outcome: Outcome, timing: Option<BootTiming>, guest: &Guest) -> RunReport {
        let exits = guest
            .vcpus
            .iter()
            .map(|v| {
                let n = |i: usize| v.exits[i].load(Ordering::Relaxed);
                (
                    n(crate::vcpu::EXIT_HYPERCALL),
                    n(crate::vcpu::EXIT_KICK),
                    n(crate::vcpu::EXIT_OTHER),
                )
            })
            .collect();
        RunReport {
            name: guest.name.clone(),
            outcome,
            timing,
            exits,
            stats: crate::stats::render(guest),
        }
    }
}

/// Boot and run one guest to its end on all host CPUs. Console output goes to `console`.
pub fn run(config: &VmConfig, console: Box<dyn Write + Send>) -> Result<RunReport, Error> {
    let options = MonitorOptions {
        timeout: config.timeout,
        ..MonitorOptions::default()
    };
    let mut reports = run_guests(std::slice::from_ref(config), vec![console], &options)?;
    Ok(reports.remove(0))
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
