//! What `activm run` is asked to run, whichever way it was asked: machine-wide settings
//! ([`Machine`]) and one [`GuestSpec`] per guest, from command-line flags (`main.rs`) or from a
//! TOML file ([`load`]). [`build`] checks both the same way and turns them into the
//! `VmConfig`s and `MonitorOptions` the monitor runs; errors name the flag or the file and key
//! the value came from.
//!
//! The file has the machine-wide keys at the top and one `[[guest]]` table per guest, in order
//! (paths are relative to the file's directory):
//!
//! ```toml
//! pcpus = 2            # also: quantum (ms), chaos (seed), timeout (s), stats, boot_timing,
//! timeout = 60         #       trace, ctl, io_latency (us, for every guest with a disk),
//!                      #       io_inline_wait (us, default 25: a disk request due within
//!                      #       this is waited for inside its exit instead of blocking),
//!                      #       host_sched (no allocator: the host schedules every vCPU),
//!                      #       place_vcpus (false: granted vCPU threads not bound to
//!                      #       their processor's host CPU), batch_sched_idle (false:
//!                      #       other guests' vCPU threads not at SCHED_IDLE beside a
//!                      #       latency-critical one; true: also under host_sched)
//!
//! [[guest]]
//! image = "rt-tests"   # the only required key
//! name = "aware"       # label in console prefixes, --stats, `activm ctl`, traces
//! vcpus = 4
//! mem = "512M"         # a size: bytes, or a string with K/M/G
//! args = ["blk", "blk-overlap"]
//! env = { RUST_LOG = "debug", GREETING = "hello" }  # the guest's environment (none by default)
//! disk = "disk.img"
//! disk_read_only = false
//! mounts = ["data:/data", "/usr/share/dict:/dict:ro"]  # HOSTDIR:GUESTDIR[:ro]
//! thread_stack = "124K"
//! thread_stacks = 256
//! latency_critical = false  # true: the allocator serves its demand before other guests'
//! prefault = false     # true: all of guest RAM is faulted in before boot
//!
//! [[guest]]
//! image = "rt-tests"
//! name = "oblivious"
//! no_activations = true
//! ```
//!
//! Exit statuses follow `activm run --help`: a file that cannot be read, is not TOML, has an
//! unknown key, a value of the wrong type, a `[[guest]]` without `image`, no `[[guest]]` at all,
//! or two guests of one name is a usage error (2); values of the right type get the status the
//! same value gets as a flag (a vCPU count out of range is 1, a non-positive timeout 2).
//!
//! The pieces: [`flags`] names the settings as flags and keys give them, [`file`] reads a
//! configuration file, [`build`] checks the settings and makes the run plan. This module is
//! plain data: it knows nothing of the monitor or the VMs it configures.

mod build;
mod disk;
mod env;
mod file;
mod flags;
mod mount;
mod net;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use build::build;
pub use disk::{DiskConfig, DEFAULT_INLINE_WAIT, MAX_INLINE_WAIT, MAX_LATENCY};
pub use env::{check_env, parse_env, EnvVar};
pub use file::{load, parse, parse_size};
pub use flags::{GuestSpec, Key, Machine};
pub use mount::{parse_mount, MountConfig};
pub use net::{parse_allow_connect, parse_publish, NetConfig};

use crate::arch::current as arch;

/// Exit status of a usage error.
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a setting activm cannot use (and of every failure to start a guest).
pub const EXIT_INVALID: u8 = 1;
/// The longest `--timeout`: a year, far beyond any run, far below what a Duration holds.
pub const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;
/// The longest `--quantum`: a minute.
pub const MAX_QUANTUM_MS: f64 = 60_000.0;

/// Guest RAM unless `--mem` or `mem` says otherwise.
pub const DEFAULT_MEM: u64 = 256 << 20;

/// Where the settings came from, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `activm run GUEST... [flags]`.
    Flags,
    /// A configuration file.
    File(PathBuf),
}

/// Why the settings cannot be run: the exit status and a message naming the flag or the file
/// and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub status: u8,
    pub message: String,
}

impl Problem {
    /// A usage error (exit status 2).
    pub fn usage(message: String) -> Problem {
        Problem {
            status: EXIT_USAGE,
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the monitor runs.
#[derive(Debug)]
pub struct RunPlan {
    pub guests: Vec<VmConfig>,
    pub options: MonitorOptions,
    /// Print `--stats` at the end.
    pub stats: bool,
}

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
    /// The guest's environment variables (nothing of the host's).
    pub env: Vec<EnvVar>,
    pub boot_timing: bool,
    pub timeout: Option<Duration>,
    /// Host TSC at process start, for boot timing.
    pub start_tsc: u64,
    /// Usable bytes of each guard-paged thread stack, and how many (default: a quarter of RAM).
    pub thread_stack_size: u64,
    pub thread_stacks: Option<u32>,
    /// The guest's block device, if any.
    pub disk: Option<DiskConfig>,
    /// Host directories mapped into the guest (`--mount HOSTDIR:GUESTDIR[:ro]`).
    pub mounts: Vec<MountConfig>,
    /// What the guest's sockets may reach (nothing by default).
    pub net: NetConfig,
    /// Whether this guest may use scheduler activations (`--no-activations`, or
    /// `no_activations` in a configuration file, clears it). Guests with and without share one
    /// budget of processors; `MonitorOptions::activations` turns them off for every guest.
    pub activations: bool,
    /// A latency-critical guest (Shenango's LC application): the allocator serves its demand
    /// for processors before that of the other guests, who share what is left. Its demand must
    /// be real: it yields idle processors (its runtime does, even while threads sleep).
    pub latency_critical: bool,
    /// Fault in all of guest RAM before boot (`--prefault`): boot pays the host's zeroing of
    /// every page, the guest's first touches do not.
    pub prefault: bool,
}

impl VmConfig {
    /// A configuration with activm's defaults for everything but the image.
    pub fn new(image: impl Into<PathBuf>) -> VmConfig {
        VmConfig {
            image: image.into(),
            name: None,
            vcpus: 1,
            mem_size: DEFAULT_MEM,
            args: Vec::new(),
            env: Vec::new(),
            boot_timing: false,
            timeout: None,
            start_tsc: arch::timestamp(),
            thread_stack_size: DEFAULT_THREAD_STACK,
            thread_stacks: None,
            disk: None,
            mounts: Vec::new(),
            net: Default::default(),
            activations: true,
            latency_critical: false,
            prefault: false,
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
            if disk.latency > MAX_LATENCY {
                return Err((
                    Key::IoLatency,
                    format!("is at most {} us", MAX_LATENCY.as_micros()),
                ));
            }
            if disk.inline_wait > MAX_INLINE_WAIT {
                return Err((
                    Key::IoInlineWait,
                    format!("is at most {} us", MAX_INLINE_WAIT.as_micros()),
                ));
            }
        }
        Ok(())
    }
}

/// Usable bytes of a thread stack unless `--thread-stack` says otherwise.
pub const DEFAULT_THREAD_STACK: u64 = 124 * 1024;

/// What the monitor does beyond running guests.
#[derive(Clone, Debug)]
pub struct MonitorOptions {
    /// Physical CPUs for all guests together.
    pub pcpus: usize,
    /// Time slice of the allocator.
    pub quantum: Duration,
    /// Whether guests may use scheduler activations at all; a guest uses them only if its own
    /// `VmConfig::activations` says so too (the command line sets that per guest).
    pub activations: bool,
    /// Stop every guest after this long.
    pub timeout: Option<Duration>,
    /// Write a Chrome trace here at the end.
    pub trace: Option<PathBuf>,
    /// Turn SIGINT/SIGTERM into SIGNAL upcalls (the CLI does; library callers usually not).
    pub handle_signals: bool,
    /// Serve the control socket here.
    pub ctl_socket: Option<PathBuf>,
    /// Chaos testing: with this seed, change the budget of physical CPUs to a random value
    /// every 100 us - 2 ms, so processors are revoked and granted all the time.
    pub chaos_seed: Option<u64>,
    /// No allocator: every vCPU thread is left to the host's scheduler, as plain KVM monitors
    /// run them (one host thread per vCPU). Implies oblivious guests; `pcpus` is ignored.
    pub host_sched: bool,
    /// Bind each processor to one host CPU and a granted vCPU's thread to it
    /// (`allocator/place.rs`; docs/activations.md, "Placing granted vCPUs on host CPUs"). On by
    /// default; `--no-place-vcpus` or `place_vcpus = false` turn it off. Never with
    /// `host_sched`.
    pub place_vcpus: bool,
    /// Beside a latency-critical guest, the vCPU threads of every other guest run at the host's
    /// idle priority (`SCHED_IDLE`), so host work on the critical guest's path (its client, its
    /// net thread) takes their CPU at once (docs/activations.md, "Best-effort guests at the
    /// host's idle priority"). `None`: on, except under `host_sched`.
    pub batch_sched_idle: Option<bool>,
    /// Testing only (`--preempt-at`): preempt vCPUs at these guest code addresses.
    pub preempt_at: Option<crate::preempt_at::Spec>,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        MonitorOptions {
            pcpus: host_cpus(),
            quantum: Duration::from_millis(10),
            activations: true,
            timeout: None,
            trace: None,
            handle_signals: false,
            ctl_socket: None,
            chaos_seed: None,
            host_sched: false,
            place_vcpus: true,
            batch_sched_idle: None,
            preempt_at: None,
        }
    }
}

/// Online host CPUs.
pub fn host_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
