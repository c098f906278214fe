//! The `activm` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

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
    /// Boot a guest ELF and run it to its end; its exit code becomes activm's.
    ///
    /// Exit status: the guest's exit code; 101 if the guest panicked; 125 if it faulted or
    /// broke the hypercall protocol (the report and registers go to stderr); 124 on --timeout;
    /// 1 if activm could not start it (bad image, no KVM, bad options); 2 for usage errors.
    Run(RunArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The guest image: a static x86_64 ELF built against activm's guest stub.
    guest: PathBuf,
    /// Number of vCPUs (1 to 64; more than host cores is fine).
    #[arg(long, default_value_t = 1, value_name = "N")]
    vcpus: u32,
    /// Guest RAM, a multiple of 2 MiB: bytes or with a K/M/G suffix.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = parse_size)]
    mem: u64,
    /// Report process start → first guest instruction → guest main on stderr.
    #[arg(long)]
    boot_timing: bool,
    /// Print per-vCPU exit counts on stderr when the guest ends.
    #[arg(long)]
    stats: bool,
    /// Usable size of each guard-paged thread stack the VMM maps for the guest runtime.
    #[arg(long, default_value = "124K", value_name = "SIZE", value_parser = parse_size)]
    thread_stack: u64,
    /// Number of guard-paged thread stacks (default: as many as fit in a quarter of RAM,
    /// at most 4096).
    #[arg(long, value_name = "N")]
    thread_stacks: Option<u32>,
    /// Stop the guest after this many seconds (exit status 124).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Arguments passed to the guest.
    #[arg(last = true, value_name = "GUEST_ARGS")]
    args: Vec<String>,
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
    }
}

fn run(args: RunArgs, start_tsc: u64) -> ExitCode {
    let timeout = match args.timeout {
        Some(secs) if !(secs > 0.0 && secs.is_finite()) => {
            eprintln!("activm: error: --timeout must be a positive number of seconds");
            return ExitCode::from(2);
        }
        other => other.map(Duration::from_secs_f64),
    };
    let config = activm::VmConfig {
        image: args.guest,
        vcpus: args.vcpus,
        mem_size: args.mem,
        args: args.args,
        boot_timing: args.boot_timing,
        timeout,
        start_tsc,
        thread_stack_size: args.thread_stack,
        thread_stacks: args.thread_stacks,
    };
    match activm::run(&config, Box::new(std::io::stdout())) {
        Ok(report) => {
            if let Some(timing) = &report.timing {
                eprint!("{}", timing.render());
            }
            if args.stats {
                for (i, (hypercalls, kicks, other)) in report.exits.iter().enumerate() {
                    eprintln!("vCPU {i}: {hypercalls} hypercall exits, {kicks} kicks, {other} other exits");
                }
            }
            if let Some(message) = report.outcome.describe() {
                eprintln!("activm: {message}");
            }
            ExitCode::from(report.outcome.exit_code() as u8)
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
    fn cli_parses_guest_args_after_double_dash() {
        let cli =
            Cli::try_parse_from(["activm", "run", "g.elf", "--vcpus", "4", "--", "exit", "3"])
                .unwrap();
        let Command::Run(args) = cli.command;
        assert_eq!(args.vcpus, 4);
        assert_eq!(args.args, ["exit", "3"]);
    }

    #[test]
    fn cli_rejects_bad_vcpus() {
        assert!(Cli::try_parse_from(["activm", "run", "g.elf", "--vcpus", "many"]).is_err());
    }
}
