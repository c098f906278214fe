//! The `activm` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    name = "activm",
    version,
    about = "A KVM virtual machine monitor whose vCPUs are scheduler activations"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot one or more guest ELFs on a shared budget of physical CPUs and run them to their end.
    ///
    /// Exit status: the guest's exit code (with several guests: 0 if all exited 0, else the
    /// first failing guest's status); 101 if a guest panicked; 125 if it faulted or broke the
    /// hypercall protocol (the report and registers go to stderr); 124 on --timeout; 128+N when
    /// stopped by signal N; 1 if activm could not start it (bad image, no KVM, bad options);
    /// 2 for usage errors.
    Run(RunArgs),
    /// Talk to a running activm through its control socket (see `activm run --ctl`).
    Ctl(CtlArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The guest images: static x86_64 ELFs built against activm's guest stub. Every guest
    /// gets the same options and arguments.
    #[arg(required = true, value_name = "GUEST")]
    guests: Vec<PathBuf>,
    /// Number of vCPUs per guest (1 to 64; more than host cores is fine).
    #[arg(long, default_value_t = 1, value_name = "N")]
    vcpus: u32,
    /// Guest RAM, a multiple of 2 MiB: bytes or with a K/M/G suffix.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = parse_size)]
    mem: u64,
    /// Physical CPUs shared by all guests (default: every host CPU).
    #[arg(long, value_name = "N")]
    pcpus: Option<usize>,
    /// The allocator's time slice, in milliseconds.
    #[arg(long, default_value_t = 10.0, value_name = "MS")]
    quantum: f64,
    /// Oblivious mode: no upcalls; vCPUs are time-sliced behind the guests' backs.
    #[arg(long)]
    no_activations: bool,
    /// Report process start → first guest instruction → guest main on stderr.
    #[arg(long)]
    boot_timing: bool,
    /// Print per-guest counts (upcalls by type, preemptions, exits) and latencies on stderr.
    #[arg(long)]
    stats: bool,
    /// Write vCPU state changes, upcalls and hypercalls as Chrome trace-event JSON.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Serve the control socket (JSON lines over a Unix socket) at this path.
    #[arg(long, value_name = "SOCKET")]
    ctl: Option<PathBuf>,
    /// Chaos testing: change the budget of physical CPUs (1 to --pcpus) to a random value every
    /// 100 us - 2 ms, from this seed, so processors are revoked and granted all the time.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// Usable size of each guard-paged thread stack the VMM maps for the guest runtime.
    #[arg(long, default_value = "124K", value_name = "SIZE", value_parser = parse_size)]
    thread_stack: u64,
    /// Number of guard-paged thread stacks (default: as many as fit in a quarter of RAM,
    /// at most 256 MiB and 4096).
    #[arg(long, value_name = "N")]
    thread_stacks: Option<u32>,
    /// A disk image (a file of whole 512-byte sectors) for the guest's block device. Give it
    /// once per guest, in guest order; one image is shared by several guests only with
    /// --disk-read-only. The image is locked while activm runs.
    #[arg(long, value_name = "IMAGE")]
    disk: Vec<PathBuf>,
    /// Attach the disks read-only (writes fail with BLK_ERR_READ_ONLY).
    #[arg(long)]
    disk_read_only: bool,
    /// Emulate a slow device: every disk read and write takes at least this long, and blocks
    /// the vCPU in the VMM (BLOCKED / UNBLOCKED upcalls). At most 10 s.
    #[arg(long, default_value_t = 0, value_name = "MICROSECONDS")]
    io_latency: u64,
    /// Stop the guests after this many seconds (exit status 124).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Arguments passed to the guests.
    #[arg(last = true, value_name = "GUEST_ARGS")]
    args: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct CtlArgs {
    /// The control socket of a running `activm run --ctl SOCKET`.
    socket: PathBuf,
    #[command(subcommand)]
    action: CtlAction,
}

#[derive(Subcommand, Debug)]
enum CtlAction {
    /// List the guests and the state of every vCPU.
    List,
    /// Change the number of physical CPUs shared by all guests.
    SetPcpus { pcpus: u64 },
    /// Cap how many vCPUs guest GUEST (an id from `list`) may run at once.
    SetVcpus { guest: u64, vcpus: u64 },
}

/// Parse `256M`, `1G`, `65536`, `64MiB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (try 256M)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => return Err(format!("unknown size suffix {suffix:?} (use K, M or G)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn main() -> ExitCode {
    let start_tsc = activm::rdtsc();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args, start_tsc),
        Command::Ctl(args) => ctl(args),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("activm: error: {message}");
    ExitCode::from(2)
}

fn run(args: RunArgs, start_tsc: u64) -> ExitCode {
    let timeout = match args.timeout {
        Some(secs) if !(secs > 0.0 && secs.is_finite()) => {
            return usage_error("--timeout must be a positive number of seconds")
        }
        other => other.map(Duration::from_secs_f64),
    };
    if !(args.quantum > 0.0 && args.quantum.is_finite()) {
        return usage_error("--quantum must be a positive number of milliseconds");
    }
    let disks: Vec<Option<activm::devices::blk::DiskConfig>> = {
        let n = args.guests.len();
        let shared = args.disk.len() == 1 && n > 1;
        if shared && !args.disk_read_only {
            return usage_error(
                "several guests cannot share one writable --disk: give one image per guest, or add --disk-read-only",
            );
        }
        if args.disk.len() > 1 && args.disk.len() != n {
            return usage_error(&format!(
                "{} --disk images for {n} guests: give one, or one per guest",
                args.disk.len()
            ));
        }
        (0..n)
            .map(|i| {
                let path = if shared {
                    args.disk.first()
                } else {
                    args.disk.get(i)
                };
                path.map(|path| activm::devices::blk::DiskConfig {
                    path: path.clone(),
                    read_only: args.disk_read_only,
                    latency: Duration::from_micros(args.io_latency),
                })
            })
            .collect()
    };
    if args.disk.is_empty() && (args.disk_read_only || args.io_latency > 0) {
        return usage_error("--disk-read-only and --io-latency need a --disk");
    }
    let configs: Vec<activm::VmConfig> = args
        .guests
        .iter()
        .zip(disks)
        .map(|(image, disk)| activm::VmConfig {
            image: image.clone(),
            vcpus: args.vcpus,
            mem_size: args.mem,
            args: args.args.clone(),
            boot_timing: args.boot_timing,
            timeout,
            start_tsc,
            thread_stack_size: args.thread_stack,
            thread_stacks: args.thread_stacks,
            disk,
        })
        .collect();
    let options = activm::MonitorOptions {
        pcpus: args.pcpus.unwrap_or_else(activm::monitor::host_cpus),
        quantum: Duration::from_secs_f64(args.quantum / 1000.0),
        activations: !args.no_activations,
        timeout,
        trace: args.trace.clone(),
        handle_signals: true,
        ctl_socket: args.ctl.clone(),
        chaos_seed: args.chaos,
    };
    let consoles: Vec<Box<dyn std::io::Write + Send>> = configs
        .iter()
        .map(|_| Box::new(std::io::stdout()) as Box<dyn std::io::Write + Send>)
        .collect();
    let reports = match activm::run_guests(&configs, consoles, &options) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("activm: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let several = reports.len() > 1;
    let mut status = 0;
    for report in &reports {
        let who = if several {
            format!("[{}] ", report.name)
        } else {
            String::new()
        };
        if let Some(timing) = &report.timing {
            eprint!("{who}{}", timing.render());
        }
        if args.stats {
            for line in report.stats.lines() {
                eprintln!("{who}{line}");
            }
            for (i, (hypercalls, kicks, other)) in report.exits.iter().enumerate() {
                eprintln!("{who}vCPU {i}: {hypercalls} hypercall exits, {kicks} kicks, {other} other exits");
            }
        }
        if let Some(message) = report.outcome.describe() {
            eprintln!("activm: {who}{message}");
        }
        if several {
            eprintln!("activm: {who}exit status {}", report.outcome.exit_code());
        }
        if status == 0 {
            status = report.outcome.exit_code();
        }
    }
    if let Some(path) = &args.trace {
        eprintln!("activm: trace written to {}", path.display());
    }
    ExitCode::from(status as u8)
}

fn ctl(args: CtlArgs) -> ExitCode {
    let request = match args.action {
        CtlAction::List => json!({"op": "list"}),
        CtlAction::SetPcpus { pcpus } => json!({"op": "set-pcpus", "pcpus": pcpus}),
        CtlAction::SetVcpus { guest, vcpus } => {
            json!({"op": "set-vcpus", "guest": guest, "vcpus": vcpus})
        }
    };
    match activm::ctl::request(&args.socket, &request) {
        Ok(answer) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_else(|_| answer.to_string())
            );
            if answer.get("ok").and_then(serde_json::Value::as_bool) == Some(true) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("activm: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn cli_parses_guests_and_guest_args() {
        let cli = Cli::try_parse_from([
            "activm", "run", "a.elf", "b.elf", "--vcpus", "4", "--pcpus", "2", "--", "exit", "3",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.guests.len(), 2);
        assert_eq!(args.vcpus, 4);
        assert_eq!(args.pcpus, Some(2));
        assert_eq!(args.args, ["exit", "3"]);
    }

    #[test]
    fn cli_parses_ctl() {
        let cli = Cli::try_parse_from(["activm", "ctl", "/tmp/s", "set-vcpus", "0", "2"]).unwrap();
        let Command::Ctl(args) = cli.command else {
            panic!("not ctl")
        };
        assert!(matches!(
            args.action,
            CtlAction::SetVcpus { guest: 0, vcpus: 2 }
        ));
    }

    #[test]
    fn cli_rejects_bad_vcpus() {
        assert!(Cli::try_parse_from(["activm", "run", "g.elf", "--vcpus", "many"]).is_err());
    }
}
