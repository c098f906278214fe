//! The settings as flags and file keys give them: the machine-wide ones and one guest's.

use std::path::PathBuf;

use super::{DEFAULT_MEM, DEFAULT_THREAD_STACK};

/// A setting, as errors name it: by its flag, or by its key in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Pcpus,
    Quantum,
    Timeout,
    IoLatency,
    IoInlineWait,
    Image,
    Name,
    Vcpus,
    Mem,
    Disk,
    DiskReadOnly,
    Mount,
    Publish,
    AllowConnect,
    ThreadStack,
    Env,
}

impl Key {
    /// The `activm run` flag.
    pub fn flag(self) -> &'static str {
        match self {
            Key::Pcpus => "--pcpus",
            Key::Quantum => "--quantum",
            Key::Timeout => "--timeout",
            Key::IoLatency => "--io-latency",
            Key::IoInlineWait => "--io-inline-wait",
            Key::Image => "GUEST",
            Key::Name => "the guest name",
            Key::Vcpus => "--vcpus",
            Key::Mem => "--mem",
            Key::Disk => "--disk",
            Key::DiskReadOnly => "--disk-read-only",
            Key::Mount => "--mount",
            Key::Publish => "--publish",
            Key::AllowConnect => "--allow-connect",
            Key::ThreadStack => "--thread-stack",
            Key::Env => "--env",
        }
    }

    /// The key in a configuration file.
    pub fn key(self) -> &'static str {
        match self {
            Key::Pcpus => "pcpus",
            Key::Quantum => "quantum",
            Key::Timeout => "timeout",
            Key::IoLatency => "io_latency",
            Key::IoInlineWait => "io_inline_wait",
            Key::Image => "image",
            Key::Name => "name",
            Key::Vcpus => "vcpus",
            Key::Mem => "mem",
            Key::Disk => "disk",
            Key::DiskReadOnly => "disk_read_only",
            Key::Mount => "mounts",
            Key::Publish => "publish",
            Key::AllowConnect => "allow_connect",
            Key::ThreadStack => "thread_stack",
            Key::Env => "env",
        }
    }
}

/// Settings for the whole machine: the processors and the services around the guests.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Physical CPUs shared by every guest (default: every host CPU).
    pub pcpus: Option<usize>,
    /// The allocator's time slice in milliseconds.
    pub quantum_ms: f64,
    /// Seed of the allocation chaos (`--chaos`).
    pub chaos: Option<u64>,
    /// Stop every guest after this many seconds.
    pub timeout_secs: Option<f64>,
    /// Print per-guest counters at the end.
    pub stats: bool,
    /// Report boot milestones.
    pub boot_timing: bool,
    /// Write a Chrome trace here.
    pub trace: Option<PathBuf>,
    /// Serve the control socket here.
    pub ctl: Option<PathBuf>,
    /// Emulated latency of every guest's disk, in microseconds.
    pub io_latency_us: u64,
    /// Longest emulated latency a disk request waits for inside its exit, in microseconds.
    pub io_inline_wait_us: u64,
    /// No allocator: every vCPU thread is left to the host's scheduler (`--host-sched`).
    pub host_sched: bool,
    /// Bind processors and granted vCPU threads to host CPUs (on unless `--no-place-vcpus` or
    /// `place_vcpus = false`).
    pub place_vcpus: bool,
    /// Best-effort vCPU threads at the host's idle priority beside a latency-critical guest
    /// (`None`: on unless `host_sched`).
    pub batch_sched_idle: Option<bool>,
    /// Settings a command-line flag set over a file's value: errors about them name the flag.
    pub from_flags: Vec<Key>,
}

impl Default for Machine {
    fn default() -> Self {
        Machine {
            pcpus: None,
            quantum_ms: 10.0,
            chaos: None,
            timeout_secs: None,
            stats: false,
            boot_timing: false,
            trace: None,
            ctl: None,
            io_latency_us: 0,
            io_inline_wait_us: super::DEFAULT_INLINE_WAIT.as_micros() as u64,
            host_sched: false,
            place_vcpus: true,
            batch_sched_idle: None,
            from_flags: Vec::new(),
        }
    }
}

/// One guest, as asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestSpec {
    pub image: PathBuf,
    pub name: Option<String>,
    pub vcpus: u32,
    /// Guest RAM in bytes.
    pub mem: u64,
    pub args: Vec<String>,
    /// The guest's environment (`--env`, `env`).
    pub env: Vec<super::EnvVar>,
    /// Scheduler activations allowed (`no_activations` clears it).
    pub activations: bool,
    /// A latency-critical guest (`latency_critical` in a configuration file): the allocator
    /// serves its demand before other guests' (see `allocator.rs`).
    pub latency_critical: bool,
    /// Guest RAM faulted in before boot (`--prefault`).
    pub prefault: bool,
    pub disk: Option<PathBuf>,
    pub disk_read_only: bool,
    /// Host directories mapped into the guest.
    pub mounts: Vec<super::MountConfig>,
    /// Usable bytes of each thread stack.
    pub thread_stack: u64,
    pub thread_stacks: Option<u32>,
    /// `HOSTPORT:GUESTPORT` entries (`--publish`).
    pub publish: Vec<String>,
    /// `HOST:PORT` entries (`--allow-connect`).
    pub allow_connect: Vec<String>,
}

impl GuestSpec {
    /// `image` with activm's defaults for the rest.
    pub fn new(image: impl Into<PathBuf>) -> GuestSpec {
        GuestSpec {
            image: image.into(),
            name: None,
            vcpus: 1,
            mem: DEFAULT_MEM,
            args: Vec::new(),
            env: Vec::new(),
            activations: true,
            latency_critical: false,
            prefault: false,
            disk: None,
            disk_read_only: false,
            mounts: Vec::new(),
            thread_stack: DEFAULT_THREAD_STACK,
            thread_stacks: None,
            publish: Vec::new(),
            allow_connect: Vec::new(),
        }
    }
}
