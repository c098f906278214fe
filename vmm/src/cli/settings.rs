//! From the command line's flags, or a configuration file and the flags that override it, to
//! the machine and guest settings `config::build` checks.

use std::path::PathBuf;

use activm::config::{self, GuestSpec, Key, Machine, Source};
use clap::parser::ValueSource;
use clap::ArgMatches;

use super::RunArgs;

/// The ids of the options given on the command line (not defaulted).
pub(crate) fn given_on_command_line(matches: &ArgMatches) -> Vec<String> {
    matches
        .ids()
        .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
        .map(|id| id.as_str().to_owned())
        .collect()
}

/// Options that set something for each guest: refused together with a configuration file.
const PER_GUEST_OPTIONS: [&str; 13] = [
    "vcpus",
    "prefault",
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
    "env",
];

/// `--thread-stack` for the id `thread_stack`.
fn flag_of(id: &str) -> String {
    match id {
        "args" => "GUEST_ARGS (after --)".into(),
        _ => format!("--{}", id.replace('_', "-")),
    }
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
pub(crate) fn settings(
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
    // A value given as a flag beside the file replaces the file's; a check that refuses it
    // then names the flag (`from_flags`).
    macro_rules! from_flag {
        ($id:literal, $field:ident) => {
            if given($id) {
                machine.$field = flags.$field;
            }
        };
        ($id:literal, $field:ident, $key:expr) => {
            from_flag!($id, $field);
            if given($id) {
                machine.from_flags.push($key);
            }
        };
    }
    from_flag!("pcpus", pcpus, Key::Pcpus);
    from_flag!("quantum", quantum_ms, Key::Quantum);
    from_flag!("timeout", timeout_secs, Key::Timeout);
    from_flag!("io_latency", io_latency_us, Key::IoLatency);
    from_flag!("io_inline_wait", io_inline_wait_us, Key::IoInlineWait);
    from_flag!("chaos", chaos);
    from_flag!("trace", trace);
    from_flag!("ctl", ctl);
    // Switches: a flag can turn them on, not off; placement is on unless a flag or the file
    // turns it off.
    machine.stats |= flags.stats;
    machine.boot_timing |= flags.boot_timing;
    machine.host_sched |= flags.host_sched;
    machine.place_vcpus &= flags.place_vcpus;
    if flags.batch_sched_idle.is_some() {
        machine.batch_sched_idle = flags.batch_sched_idle;
    }
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
        io_inline_wait_us: args.io_inline_wait,
        host_sched: args.host_sched,
        place_vcpus: !args.no_place_vcpus,
        batch_sched_idle: match (args.batch_sched_idle, args.no_batch_sched_idle) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
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
            env: args.env.clone(),
            activations: !args.no_activations,
            latency_critical: false,
            prefault: args.prefault,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, FromArgMatches, Parser};

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
        for defaulted in [
            "vcpus",
            "mem",
            "quantum",
            "no_activations",
            "io_latency",
            "io_inline_wait",
        ] {
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
