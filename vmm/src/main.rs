//! The `activm` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use activm::config::{self, Source};
use activm::console::{self, ConsoleBuffer};
use clap::{CommandFactory, FromArgMatches};
use serde_json::json;

mod cli;
use cli::settings::{given_on_command_line, settings};
use cli::{Cli, Command, CtlAction, CtlArgs, RunArgs};

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

fn problem(problem: config::Problem) -> ExitCode {
    eprintln!("activm: error: {}", problem.message);
    ExitCode::from(problem.status)
}

fn run(args: RunArgs, given: &[String], start_tsc: u64) -> ExitCode {
    let (mut plan, source) = match settings(&args, given).and_then(|(machine, guests, source)| {
        config::build(&machine, &guests, &source, start_tsc).map(|plan| (plan, source))
    }) {
        Ok(planned) => planned,
        Err(e) => return problem(e),
    };
    plan.options.preempt_at = args
        .preempt_at
        .as_ref()
        .map(|points| activm::preempt_at::Spec {
            points: points.0.clone(),
            count: args.preempt_at_count,
        });
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
        for line in report.hang.iter().flat_map(|hang| hang.lines()) {
            eprintln!("activm: {who}{line}");
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
    use clap::Parser;

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
