//! The command line's grammar (clap): `activm run` and `activm ctl`.

use std::path::PathBuf;

use activm::config;
use clap::{Parser, Subcommand};

pub(crate) mod settings;

#[derive(Parser, Debug)]
#[command(
    name = "activm",
    version,
    about = "A KVM virtual machine monitor whose vCPUs are scheduler activations"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Boot one or more guest ELFs on a shared budget of physical CPUs and run them to their end.
    ///
    /// Exit status: the guest's exit code (with several guests: 0 if all exited 0, else the
    /// first failing guest's status); 101 if a guest panicked; 125 if it faulted or broke the
    /// hypercall protocol (the report and registers go to stderr); 124 on --timeout; 128+N when
    /// stopped by signal N; 159 if a VMM thread made a system call its seccomp filter forbids
    /// (docs/security.md); 1 if activm could not start it (bad image, no KVM, bad options, a
    /// --ctl path holding anything but a stale socket);
    /// 2 for usage errors (with --config: also a file that cannot be read, is not TOML, has an
    /// unknown key, a value of the wrong type, a guest without an image or no guest; values
    /// of the right type get the status they get as flags).
    Run(Box<RunArgs>),
    /// Talk to a running activm through its control socket (see `activm run --ctl`).
    Ctl(CtlArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// The guest images: static x86_64 ELFs built against activm's guest stub. Every guest
    /// gets the same options and arguments (per-guest settings: --config). A lone GUEST whose
    /// name ends in .toml is read as --config GUEST.
    #[arg(required_unless_present = "config", value_name = "GUEST")]
    pub(crate) guests: Vec<PathBuf>,
    /// Read the guests and the machine-wide settings from a TOML file.
    ///
    /// At the top, the machine-wide keys, as the flags: pcpus, quantum (ms), chaos (seed),
    /// timeout (s), stats, boot_timing, trace, ctl, io_latency (us), io_inline_wait (us),
    /// host_sched, place_vcpus (default true), batch_sched_idle. Then one [[guest]] table per guest: image
    /// (required), name (its label in output, --stats and `activm ctl`),
    /// vcpus, mem, args (an array of strings), env (a table of KEY = "VALUE"), no_activations, disk, disk_read_only, mounts
    /// (an array of "HOSTDIR:GUESTDIR[:ro]"),
    /// thread_stack, thread_stacks, prefault. Sizes are numbers of bytes or strings like "256M"; paths
    /// are relative to the file's directory. Unknown keys are errors.
    ///
    /// Machine-wide flags given with --config (--pcpus, --quantum, --chaos, --timeout, --stats,
    /// --boot-timing, --trace, --ctl, --io-latency, --io-inline-wait, --host-sched,
    /// --no-place-vcpus, --[no-]batch-sched-idle) override the file. Per-guest
    /// ones (GUEST, --vcpus, --mem, --no-activations, --disk, --disk-read-only, --thread-stack,
    /// --thread-stacks, --prefault, --env, GUEST_ARGS) are refused: set them in the [[guest]] tables.
    #[arg(long, value_name = "FILE.toml")]
    pub(crate) config: Option<PathBuf>,
    /// Number of vCPUs per guest (1 to 64; more than host cores is fine).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) vcpus: u32,
    /// Guest RAM, a multiple of 2 MiB: bytes or with a K/M/G suffix.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = config::parse_size)]
    pub(crate) mem: u64,
    /// Physical CPUs shared by all guests (default: every host CPU).
    #[arg(long, value_name = "N")]
    pub(crate) pcpus: Option<usize>,
    /// The allocator's time slice, in milliseconds.
    #[arg(long, default_value_t = 10.0, value_name = "MS")]
    pub(crate) quantum: f64,
    /// Oblivious mode: no upcalls; vCPUs are time-sliced behind the guests' backs.
    #[arg(long)]
    pub(crate) no_activations: bool,
    /// Host-scheduled, as plain KVM: no allocator, every vCPU thread is left to the host's
    /// scheduler (Linux). Implies --no-activations for every guest; --pcpus and --quantum do
    /// not apply. To confine activm to some host CPUs, run it under `taskset -c LIST`.
    #[arg(long, conflicts_with = "chaos")]
    pub(crate) host_sched: bool,
    /// Leave granted vCPU threads wherever Linux puts them. By default each of the --pcpus
    /// processors is one host CPU and a granted vCPU's thread is bound to its processor's CPU
    /// before it is woken (only when --pcpus covers every CPU activm may use; never with
    /// --host-sched). See docs/activations.md, "Placing granted vCPUs on host CPUs".
    #[arg(long)]
    pub(crate) no_place_vcpus: bool,
    /// Beside a latency-critical guest, run every other guest's vCPU threads at the host's idle
    /// priority (SCHED_IDLE) also under --host-sched (what a plain KVM user can do with
    /// `chrt --idle`). On by default without --host-sched. See docs/activations.md,
    /// "Best-effort guests at the host's idle priority".
    #[arg(long, conflicts_with = "no_batch_sched_idle")]
    pub(crate) batch_sched_idle: bool,
    /// Leave every vCPU thread at the host's normal priority, even beside a latency-critical
    /// guest.
    #[arg(long)]
    pub(crate) no_batch_sched_idle: bool,
    /// Placement as above: the default, accepted for scripts written when it was not.
    #[arg(long, hide = true, conflicts_with_all = ["no_place_vcpus", "host_sched"])]
    pub(crate) place_vcpus: bool,
    /// Fault in all of guest RAM before the guest starts (as QEMU's -mem-prealloc): the host's
    /// zeroing of fresh pages moves from the guest's first touches to boot, and boot takes time
    /// proportional to --mem.
    #[arg(long)]
    pub(crate) prefault: bool,
    /// Report process start → first guest instruction → guest main on stderr.
    #[arg(long)]
    pub(crate) boot_timing: bool,
    /// Print per-guest counts (upcalls by type, preemptions, exits) and latencies on stderr.
    #[arg(long)]
    pub(crate) stats: bool,
    /// Write vCPU state changes, upcalls and hypercalls as Chrome trace-event JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,
    /// Serve the control socket (JSON lines over a Unix socket) at this path.
    #[arg(long, value_name = "SOCKET")]
    pub(crate) ctl: Option<PathBuf>,
    /// Chaos testing: change the budget of physical CPUs (1 to --pcpus) to a random value every
    /// 100 us - 2 ms, from this seed, so processors are revoked and granted all the time.
    #[arg(long, value_name = "SEED")]
    pub(crate) chaos: Option<u64>,
    /// Testing only: preempt a vCPU when it reaches one of these CPL3 code addresses of the
    /// guest image (symbols, plus an offset in bytes; `0x...` for an address), exactly there,
    /// through the normal hand-off (x86_64; docs/activations.md, "Preempting at an address").
    /// An unknown symbol is an error (exit status 1).
    #[arg(long, hide = true, value_name = "SYMBOL[+OFFSET][,...]", value_parser = parse_preempt_points)]
    pub(crate) preempt_at: Option<PreemptPoints>,
    /// Testing only: how many --preempt-at preemptions in all (per guest).
    #[arg(long, hide = true, default_value_t = 16, value_name = "N")]
    pub(crate) preempt_at_count: u32,
    /// Usable size of each guard-paged thread stack the VMM maps for the guest runtime.
    #[arg(long, default_value = "124K", value_name = "SIZE", value_parser = config::parse_size)]
    pub(crate) thread_stack: u64,
    /// Number of guard-paged thread stacks (default: as many as fit in a quarter of RAM,
    /// at most 256 MiB and 4096).
    #[arg(long, value_name = "N")]
    pub(crate) thread_stacks: Option<u32>,
    /// A disk image (a file of whole 512-byte sectors) for the guest's block device. Give it
    /// once per guest, in guest order; one image is shared by several guests only with
    /// --disk-read-only. The image is locked while activm runs.
    #[arg(long, value_name = "IMAGE")]
    pub(crate) disk: Vec<PathBuf>,
    /// Map the host directory HOSTDIR at GUESTDIR (absolute) in every guest, for std::fs
    /// (repeatable). Nothing outside HOSTDIR is reachable (`..`, symbolic links leading out
    /// are refused). With `:ro`, writes fail with EROFS.
    #[arg(long, value_name = "HOSTDIR:GUESTDIR[:ro]", value_parser = activm::config::parse_mount)]
    pub(crate) mount: Vec<activm::config::MountConfig>,
    /// Attach the disks read-only (writes fail with BLK_ERR_READ_ONLY).
    #[arg(long)]
    pub(crate) disk_read_only: bool,
    /// Emulate a slow device: every disk read and write takes at least this long, and blocks
    /// the vCPU in the VMM (BLOCKED / UNBLOCKED upcalls). At most 10 s.
    #[arg(long, default_value_t = 0, value_name = "MICROSECONDS")]
    pub(crate) io_latency: u64,
    /// Two-phase wait: a disk request whose data moved inside its exit and whose remaining
    /// latency ends within this is waited for in the exit (the vCPU keeps its processor)
    /// instead of blocking (BLOCKED / UNBLOCKED) or completing later. 0: only what is done by
    /// then. At most 1000 us. Default: below the cost of blocking (docs/activations.md)
    #[arg(long, default_value_t = 25, value_name = "MICROSECONDS")]
    pub(crate) io_inline_wait: u64,
    /// Publish a guest port: a guest listening on GUESTPORT is reached at 127.0.0.1:HOSTPORT
    /// (repeatable; with several guests, the first guest's). Guests reach nothing otherwise.
    /// A `/udp` suffix publishes a UDP port (`5353:53/udp`).
    #[arg(long, value_name = "HOSTPORT:GUESTPORT[/udp]")]
    pub(crate) publish: Vec<String>,
    /// Set an environment variable in every guest (repeatable; std's `env::var` reads it).
    /// Guests see only these: nothing of activm's own environment. Arguments and environment
    /// share one 4096-byte block.
    #[arg(long, value_name = "KEY=VALUE", value_parser = config::parse_env)]
    pub(crate) env: Vec<config::EnvVar>,
    /// Let the guest connect to this loopback HOST:PORT (repeatable; the first guest's). With
    /// `/udp`: let it send datagrams there (`127.0.0.1:9000/udp`).
    #[arg(long, value_name = "HOST:PORT[/udp]")]
    pub(crate) allow_connect: Vec<String>,
    /// Stop the guests after this many seconds (exit status 124).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) timeout: Option<f64>,
    /// Debugging: run without the seccomp filters and the Landlock rules (docs/security.md).
    #[arg(long)]
    pub(crate) no_sandbox: bool,
    /// Arguments passed to the guests.
    #[arg(last = true, value_name = "GUEST_ARGS")]
    pub(crate) args: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct CtlArgs {
    /// The control socket of a running `activm run --ctl SOCKET`.
    pub(crate) socket: PathBuf,
    #[command(subcommand)]
    pub(crate) action: CtlAction,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CtlAction {
    /// List the guests and the state of every vCPU.
    List,
    /// Change the number of physical CPUs shared by all guests.
    SetPcpus { pcpus: u64 },
    /// Cap how many vCPUs guest GUEST (an id from `list`) may run at once.
    SetVcpus { guest: u64, vcpus: u64 },
}

/// The points of `--preempt-at`.
#[derive(Clone, Debug)]
pub(crate) struct PreemptPoints(pub(crate) Vec<activm::preempt_at::Point>);

fn parse_preempt_points(text: &str) -> Result<PreemptPoints, String> {
    activm::preempt_at::parse_points(text).map(PreemptPoints)
}
