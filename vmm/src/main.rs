//! The `activm` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use activm::config::{self, GuestSpec, Key, Machine, Source};
use activm::console::{self, ConsoleBuffer};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
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
struct RunArgs {
    /// The guest images: static x86_64 ELFs built against activm's guest stub. Every guest
    /// gets the same options and arguments (per-guest settings: --config). A lone GUEST whose
    /// name ends in .toml is read as --config GUEST.
    #[arg(required_unless_present = "config", value_name = "GUEST")]
    guests: Vec<PathBuf>,
    /// Read the guests and the machine-wide settings from a TOML file.
    ///
    /// At the top, the machine-wide keys, as the flags: pcpus, quantum (ms), chaos (seed),
    /// timeout (s), stats, boot_timing, trace, ctl, io_latency (us), host_sched. Then one
    /// [[guest]] table per guest: image (required), name (its label in output, --stats and
    /// `activm ctl`),
    /// vcpus, mem, args (an array of strings), no_activations, disk, disk_read_only, mounts
    /// (an array of "HOSTDIR:GUESTDIR[:ro]"),
    /// thread_stack, thread_stacks. Sizes are numbers of bytes or strings like "256M"; paths
    /// are relative to the file's directory. Unknown keys are errors.
    ///
    /// Machine-wide flags given with --config (--pcpus, --quantum, --chaos, --timeout, --stats,
    /// --boot-timing, --trace, --ctl, --io-latency, --host-sched) override the file. Per-guest
    /// ones (GUEST, --vcpus, --mem, --no-activations, --disk, --disk-read-only, --thread-stack,
    /// --thread-stacks, GUEST_ARGS) are refused: set them in the [[guest]] tables.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Number of vCPUs per guest (1 to 64; more than host cores is fine).
    #[arg(long, default_value_t = 1, value_name = "N")]
    vcpus: u32,
    /// Guest RAM, a multiple of 2 MiB: bytes or with a K/M/G suffix.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = config::parse_size)]
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
    /// Host-scheduled, as plain KVM: no allocator, every vCPU thread is left to the host's
    /// scheduler (Linux). Implies --no-activations for every guest; --pcpus and --quantum do
    /// not apply. To confine activm to some host CPUs, run it under `taskset -c LIST`.
    #[arg(long, conflicts_with = "chaos")]
    host_sched: bool,
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
    #[arg(long, default_value = "124K", value_name = "SIZE", value_parser = config::parse_size)]
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
    /// Map the host directory HOSTDIR at GUESTDIR (absolute) in every guest, for std::fs
    /// (repeatable). Nothing outside HOSTDIR is reachable (`..`, symbolic links leading out
    /// are refused). With `:ro`, writes fail with EROFS.
    #[arg(long, value_name = "HOSTDIR:GUESTDIR[:ro]", value_parser = activm::devices::fs_path::parse_mount)]
    mount: Vec<activm::devices::fs_path::MountConfig>,
    /// Attach the disks read-only (writes fail with BLK_ERR_READ_ONLY).
    #[arg(long)]
    disk_read_only: bool,
    /// Emulate a slow device: every disk read and write takes at least this long, and blocks
    /// the vCPU in the VMM (BLOCKED / UNBLOCKED upcalls). At most 10 s.
    #[arg(long, default_value_t = 0, value_name = "MICROSECONDS")]
    io_latency: u64,
    /// Publish a guest port: a guest listening on GUESTPORT is reached at 127.0.0.1:HOSTPORT
    /// (repeatable; with several guests, the first guest's). Guests reach nothing otherwise.
    #[arg(long, value_name = "HOSTPORT:GUESTPORT")]
    publish: Vec<String>,
    /// Let the guest connect to this loopback HOST:PORT (repeatable; the first guest's).
    #[arg(long, value_name = "HOST:PORT")]
    allow_connect: Vec<String>,
    /// Stop the guests after this many seconds (exit status 124).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Debugging: run without the seccomp filters and the Landlock rules (docs/security.md).
    #[arg(long)]
    no_sandbox: bool,
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

/// How long the end of a run waits for console output that makes no progress.
const CONSOLE_PATIENCE: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let start_tsc = activm::rdtsc();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Run(args) => {
            let given = matches
                .subcommand_matches("run")
                .map(given_on_command_line)
                .unwrap_or_default();
            run(*args, &given, start_tsc)
        }
        Command::Ctl(args) => ctl(args),
    }
}

/// The ids of the options given on the command line (not defaulted).
fn given_on_command_line(matches: &ArgMatches) -> Vec<String> {
    matches
        .ids()
        .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
        .map(|id| id.as_str().to_owned())
        .collect()
}

/// Options that set something for each guest: refused together with a configuration file.
const PER_GUEST_OPTIONS: [&str; 11] = [
    "vcpus",
    "mem",
    "no_activations",
    "disk",
    "disk_read_only",
    "mount",
    "thread_stack",
    "thread_stacks",
    "publish",
    "allow_connect",
    "args",
];

/// `--thread-stack` for the id `thread_stack`.
fn flag_of(id: &str) -> String {
    match id {
        "args" => "GUEST_ARGS (after --)".into(),
        _ => format!("--{}", id.replace('_', "-")),
    }
}

fn problem(problem: config::Problem) -> ExitCode {
    eprintln!("activm: error: {}", problem.message);
    ExitCode::from(problem.status)
}

/// The configuration file to read: `--config`, or a lone GUEST ending in `.toml`.
fn config_file(args: &RunArgs) -> Result<Option<PathBuf>, String> {
    let is_toml = |p: &PathBuf| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
    };
    if let Some(path) = &args.config {
        if !args.guests.is_empty() {
            return Err(format!(
                "GUEST images cannot be given with --config: list them as [[guest]] tables in {}",
                path.display()
            ));
        }
        return Ok(Some(path.clone()));
    }
    match &args.guests[..] {
        [only] if is_toml(only) => Ok(Some(only.clone())),
        several => match several.iter().find(|p| is_toml(p)) {
            Some(file) => Err(format!(
                "{} looks like a configuration file: give it alone, or with --config",
                file.display()
            )),
            None => Ok(None),
        },
    }
}

/// What to run, from the flags alone or from a configuration file and the flags that override
/// it.
fn settings(
    args: &RunArgs,
    given: &[String],
) -> Result<(Machine, Vec<GuestSpec>, Source), config::Problem> {
    let usage = config::Problem::usage;
    let Some(file) = config_file(args).map_err(usage)? else {
        return Ok((
            machine_from_flags(args),
            guests_from_flags(args)?,
            Source::Flags,
        ));
    };
    if let Some(id) = PER_GUEST_OPTIONS
        .iter()
        .find(|id| given.iter().any(|g| g == *id))
    {
        return Err(usage(format!(
            "{} cannot be given with a configuration file: set `{id}` in the [[guest]] tables of {}",
            flag_of(id),
            file.display()
        )));
    }
    let (mut machine, guests) = config::load(&file)?;
    let flags = machine_from_flags(args);
    let given = |id: &str| given.iter().any(|g| g == id);
    if given("pcpus") {
        machine.pcpus = flags.pcpus;
        machine.from_flags.push(Key::Pcpus);
    }
    if given("quantum") {
        machine.quantum_ms = flags.quantum_ms;
        machine.from_flags.push(Key::Quantum);
    }
    if given("timeout") {
        machine.timeout_secs = flags.timeout_secs;
        machine.from_flags.push(Key::Timeout);
    }
    if given("io_latency") {
        machine.io_latency_us = flags.io_latency_us;
        machine.from_flags.push(Key::IoLatency);
    }
    if given("chaos") {
        machine.chaos = flags.chaos;
    }
    if given("trace") {
        machine.trace = flags.trace;
    }
    if given("ctl") {
        machine.ctl = flags.ctl;
    }
    // Switches: a flag can turn them on, not off.
    machine.stats |= flags.stats;
    machine.boot_timing |= flags.boot_timing;
    machine.host_sched |= flags.host_sched;
    Ok((machine, guests, Source::File(file)))
}

fn machine_from_flags(args: &RunArgs) -> Machine {
    Machine {
        pcpus: args.pcpus,
        quantum_ms: args.quantum,
        chaos: args.chaos,
        timeout_secs: args.timeout,
        stats: args.stats,
        boot_timing: args.boot_timing,
        trace: args.trace.clone(),
        ctl: args.ctl.clone(),
        io_latency_us: args.io_latency,
        host_sched: args.host_sched,
        from_flags: Vec::new(),
    }
}

/// Every GUEST with the same settings; the `--disk` images one per guest, or one shared
/// read-only.
fn guests_from_flags(args: &RunArgs) -> Result<Vec<GuestSpec>, config::Problem> {
    let usage = |message: &str| config::Problem::usage(message.into());
    let n = args.guests.len();
    let shared = args.disk.len() == 1 && n > 1;
    if shared && !args.disk_read_only {
        return Err(usage(
            "several guests cannot share one writable --disk: give one image per guest, or add --disk-read-only",
        ));
    }
    if args.disk.len() > 1 && args.disk.len() != n {
        return Err(usage(&format!(
            "{} --disk images for {n} guests: give one, or one per guest",
            args.disk.len()
        )));
    }
    if args.disk.is_empty() && (args.disk_read_only || args.io_latency > 0) {
        return Err(usage("--disk-read-only and --io-latency need a --disk"));
    }
    Ok(args
        .guests
        .iter()
        .enumerate()
        .map(|(i, image)| GuestSpec {
            image: image.clone(),
            name: None,
            vcpus: args.vcpus,
            mem: args.mem,
            args: args.args.clone(),
            activations: !args.no_activations,
            disk: if shared {
                args.disk.first().cloned()
            } else {
                args.disk.get(i).cloned()
            },
            disk_read_only: args.disk_read_only,
            mounts: args.mount.clone(),
            thread_stack: args.thread_stack,
            thread_stacks: args.thread_stacks,
            publish: if i == 0 {
                args.publish.clone()
            } else {
                Vec::new()
            },
            allow_connect: if i == 0 {
                args.allow_connect.clone()
            } else {
                Vec::new()
            },
        })
        .collect())
}

fn run(args: RunArgs, given: &[String], start_tsc: u64) -> ExitCode {
    let (plan, source) = match settings(&args, given).and_then(|(machine, guests, source)| {
        config::build(&machine, &guests, &source, start_tsc).map(|plan| (plan, source))
    }) {
        Ok(planned) => planned,
        Err(e) => return problem(e),
    };
    activm::sandbox::configure(!args.no_sandbox);
    allow_paths(&plan, &source);
    let console = match ConsoleBuffer::spawn(Box::new(std::io::stdout()), console::CAPACITY) {
        Ok(console) => console,
        Err(e) => {
            eprintln!("activm: error: cannot start the console thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    let consoles: Vec<Box<dyn std::io::Write + Send>> = plan
        .guests
        .iter()
        .map(|_| Box::new(console.writer()) as Box<dyn std::io::Write + Send>)
        .collect();
    let result = activm::run_guests(&plan.guests, consoles, &plan.options);
    if !console.drain(CONSOLE_PATIENCE) {
        eprintln!("activm: the console output is not being read; what was left is dropped");
    }
    if console.dropped() > 0 {
        eprintln!(
            "activm: {} bytes of console output were dropped (the output was not read)",
            console.dropped()
        );
    }
    let reports = match result {
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
        if plan.stats {
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
    if let Some(path) = &plan.options.trace {
        eprintln!("activm: trace written to {}", path.display());
    }
    ExitCode::from(status as u8)
}

/// What the sandboxed VMM may still open: what it was given.
fn allow_paths(plan: &config::RunPlan, source: &Source) {
    use activm::sandbox::{allow_path, Access};
    if let Source::File(file) = source {
        allow_path(file.clone(), Access::Read);
    }
    for guest in &plan.guests {
        allow_path(guest.image.clone(), Access::Read);
        if let Some(disk) = &guest.disk {
            let access = if disk.read_only {
                Access::Read
            } else {
                Access::ReadWrite
            };
            allow_path(disk.path.clone(), access);
        }
        for mount in &guest.mounts {
            let access = if mount.read_only {
                Access::Tree
            } else {
                Access::TreeWrite
            };
            allow_path(mount.host.clone(), access);
        }
    }
    if let Some(trace) = &plan.options.trace {
        allow_path(trace.clone(), Access::Write);
    }
    if let Some(socket) = &plan.options.ctl_socket {
        let dir = match socket.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        allow_path(dir, Access::SocketDir);
    }
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

    /// `activm run ARGS...`: the run arguments and the options given on the command line.
    fn parse_run(args: &[&str]) -> (RunArgs, Vec<String>) {
        let argv = ["activm", "run"].iter().chain(args);
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let given = given_on_command_line(matches.subcommand_matches("run").unwrap());
        let Command::Run(run) = Cli::from_arg_matches(&matches).unwrap().command else {
            panic!("not run")
        };
        (*run, given)
    }

    /// A configuration file in a fresh temporary directory, removed when dropped.
    struct TempConfig(PathBuf);

    impl TempConfig {
        fn new(name: &str, text: &str) -> TempConfig {
            let dir = std::env::temp_dir()
                .join(format!("activm-main-test-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("run.toml");
            std::fs::write(&path, text).unwrap();
            TempConfig(path)
        }

        fn arg(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempConfig {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
        }
    }

    #[test]
    fn only_options_on_the_command_line_count_as_given() {
        let (_, given) = parse_run(&["g.elf", "--pcpus", "2", "--stats"]);
        assert!(given.contains(&"pcpus".to_string()));
        assert!(given.contains(&"stats".to_string()));
        for defaulted in ["vcpus", "mem", "quantum", "no_activations", "io_latency"] {
            assert!(!given.contains(&defaulted.to_string()), "{defaulted}");
        }
        let (_, given) = parse_run(&["g.elf", "--vcpus", "1", "--", "x"]);
        assert!(given.contains(&"vcpus".to_string()));
        assert!(given.contains(&"args".to_string()));
    }

    #[test]
    fn a_config_file_is_named_by_flag_or_alone() {
        let (args, _) = parse_run(&["--config", "dir/run.toml"]);
        assert_eq!(config_file(&args), Ok(Some("dir/run.toml".into())));
        let (args, _) = parse_run(&["dir/run.TOML"]);
        assert_eq!(config_file(&args), Ok(Some("dir/run.TOML".into())));
        let (args, _) = parse_run(&["a.elf", "b.elf"]);
        assert_eq!(config_file(&args), Ok(None));
        let (args, _) = parse_run(&["a.elf", "run.toml"]);
        assert!(config_file(&args)
            .unwrap_err()
            .contains("run.toml looks like a configuration file"));
        let (args, _) = parse_run(&["--config", "run.toml", "a.elf"]);
        assert!(config_file(&args)
            .unwrap_err()
            .starts_with("GUEST images cannot be given with --config"));
        assert!(Cli::try_parse_from(["activm", "run", "--vcpus", "2"]).is_err());
    }

    #[test]
    fn machine_flags_override_the_file() {
        let file = TempConfig::new(
            "override",
            "pcpus = 4\ntimeout = 60\nstats = false\n[[guest]]\nimage = \"a\"\nvcpus = 3\n",
        );
        let (args, given) = parse_run(&[
            "--config",
            file.arg(),
            "--pcpus",
            "1",
            "--timeout",
            "2.5",
            "--stats",
        ]);
        let (machine, guests, source) = settings(&args, &given).unwrap();
        assert_eq!(source, Source::File(file.0.clone()));
        assert_eq!(machine.pcpus, Some(1));
        assert_eq!(machine.timeout_secs, Some(2.5));
        assert!(machine.stats);
        assert_eq!(machine.quantum_ms, 10.0);
        assert_eq!(machine.from_flags, [Key::Pcpus, Key::Timeout]);
        assert_eq!(guests.len(), 1);
        assert_eq!(guests[0].vcpus, 3);
        assert_eq!(guests[0].image, file.0.parent().unwrap().join("a"));
        // Without the flags, the file's values stand.
        let (args, given) = parse_run(&[file.arg()]);
        let (machine, _, _) = settings(&args, &given).unwrap();
        assert_eq!((machine.pcpus, machine.timeout_secs), (Some(4), Some(60.0)));
        // A bad override is named as the flag.
        let (args, given) = parse_run(&["--config", file.arg(), "--timeout", "0"]);
        let (machine, guests, source) = settings(&args, &given).unwrap();
        let problem = config::build(&machine, &guests, &source, 0).unwrap_err();
        assert_eq!(
            problem.message,
            "--timeout must be a positive number of seconds"
        );
    }

    #[test]
    fn per_guest_flags_are_refused_with_a_file() {
        let file = TempConfig::new("refuse", "[[guest]]\nimage = \"a\"\n");
        for (flags, named) in [
            (&["--vcpus", "2"][..], "--vcpus"),
            (&["--mem", "64M"], "--mem"),
            (&["--no-activations"], "--no-activations"),
            (&["--disk", "d.img"], "--disk"),
            (&["--disk-read-only"], "--disk-read-only"),
            (&["--thread-stack", "64K"], "--thread-stack"),
            (&["--thread-stacks", "8"], "--thread-stacks"),
            (&["--", "exit", "3"], "GUEST_ARGS"),
        ] {
            let mut argv = vec!["--config", file.arg()];
            argv.extend(flags);
            let (args, given) = parse_run(&argv);
            let problem = settings(&args, &given).unwrap_err();
            assert_eq!(problem.status, config::EXIT_USAGE);
            assert!(
                problem.message.starts_with(named)
                    && problem
                        .message
                        .contains("cannot be given with a configuration file"),
                "{}",
                problem.message
            );
        }
    }

    #[test]
    fn flags_give_every_guest_the_same_settings() {
        let (args, given) = parse_run(&[
            "a.elf",
            "b.elf",
            "--vcpus",
            "2",
            "--no-activations",
            "--disk",
            "d.img",
            "--disk-read-only",
            "--",
            "x",
        ]);
        let (machine, guests, source) = settings(&args, &given).unwrap();
        assert_eq!(source, Source::Flags);
        assert_eq!(machine.from_flags, []);
        for (guest, image) in guests.iter().zip(["a.elf", "b.elf"]) {
            assert_eq!(
                guest,
                &GuestSpec {
                    vcpus: 2,
                    args: vec!["x".into()],
                    activations: false,
                    disk: Some("d.img".into()),
                    disk_read_only: true,
                    ..GuestSpec::new(image)
                }
            );
        }
    }
}
