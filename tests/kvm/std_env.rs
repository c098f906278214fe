//! A std guest's wall clock and environment: `SystemTime::now()` is the host's time, and
//! `std::env::var` sees what `--env` or a file's `env` table gives, and nothing of activm's own
//! environment; bad `--env` values are refused before anything runs.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use libtest_mimic::{Failed, Trial};

use super::std_guests::std_guest;
use super::{activm, Run, TempDir, ACTIVM, GUEST_TIMEOUT_SECS};

/// A variable set in activm's own environment: a guest must never see it.
const HOST_ONLY: &str = "ACTIVM_TEST_HOST_ONLY";

/// The furthest the guest's wall clock may be from the host's (a loaded host may take seconds
/// to boot a guest; a clock counting from the epoch is off by decades).
const CLOCK_SLACK_SECS: u64 = 120;

/// `activm run std-demo OPTIONS -- env-clock NAMES...`, with [`HOST_ONLY`] in activm's
/// environment.
fn env_clock(options: &[&str], names: &[&str]) -> Result<Run, Failed> {
    let output = Command::new(ACTIVM)
        .arg("run")
        .arg(std_guest("std-demo")?)
        .args(["--timeout", GUEST_TIMEOUT_SECS])
        .args(options)
        .arg("--")
        .arg("env-clock")
        .args(names)
        .env(HOST_ONLY, "leaked")
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    Ok(Run::from(output))
}

/// The guest's `now: SECS` line is within [`CLOCK_SLACK_SECS`] of the host's clock.
fn check_clock(run: &Run) -> Result<(), Failed> {
    let guest: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("now: "))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no `now: SECS` line\n--- stdout\n{}", run.stdout))?;
    let host = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    if guest.abs_diff(host) <= CLOCK_SLACK_SECS {
        Ok(())
    } else {
        Err(format!(
            "guest wall clock {guest} s, host {host} s: more than {CLOCK_SLACK_SECS} s apart"
        )
        .into())
    }
}

/// Runs under KVM.
pub(crate) fn tests() -> Vec<Trial> {
    let mut trials = Vec::new();
    for (vcpus, activations) in [("1", true), ("2", false)] {
        let suffix = if activations { "" } else { "_no_activations" };
        trials.push(Trial::test(
            format!("std_env_and_wall_clock{suffix}_{vcpus}_vcpus"),
            move || {
                let mut options = vec![
                    "--vcpus",
                    vcpus,
                    "--env",
                    "GREETING=hello = world",
                    "--env",
                    "EMPTY=",
                ];
                if !activations {
                    options.push("--no-activations");
                }
                let run = env_clock(&options, &["GREETING", "EMPTY", "MISSING", HOST_ONLY])?
                    .expect_code(0)?;
                check_clock(&run)?;
                run.stdout_has("\nGREETING: Some(\"hello = world\")\n")?
                    .stdout_has("\nEMPTY: Some(\"\")\n")?
                    .stdout_has("\nMISSING: None\n")?
                    .stdout_has(&format!("\n{HOST_ONLY}: None\n"))?
                    .stdout_has("\nvars: 2\n")?;
                Ok(())
            },
        ));
    }
    trials.push(Trial::test("std_env_empty_without_flags", || {
        let run = env_clock(&[], &["GREETING", HOST_ONLY, "PATH", "HOME"])?.expect_code(0)?;
        check_clock(&run)?;
        run.stdout_has("\nGREETING: None\n")?
            .stdout_has(&format!("\n{HOST_ONLY}: None\n"))?
            .stdout_has("\nPATH: None\n")?
            .stdout_has("\nHOME: None\n")?
            .stdout_has("\nvars: 0\n")?;
        Ok(())
    }));
    trials.push(Trial::test(
        "std_random_bytes_differ_per_run_and_come_from_the_host",
        || {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let run = Command::new(ACTIVM)
                    .arg("run")
                    .arg(std_guest("std-demo")?)
                    .args([
                        "--vcpus",
                        "2",
                        "--timeout",
                        GUEST_TIMEOUT_SECS,
                        "--",
                        "entropy",
                    ])
                    .output()
                    .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
                let run = Run::from(run).expect_code(0)?;
                if run.stdout.contains("no entropy seed") || run.stderr.contains("no entropy seed")
                {
                    return Err(format!("the guest fell back to its clock\n{}", run.stdout).into());
                }
                let line = run
                    .stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("random hashes: "))
                    .ok_or_else(|| {
                        format!("no `random hashes:` line\n--- stdout\n{}", run.stdout)
                    })?;
                seen.extend(line.split(' ').map(str::to_owned));
            }
            let mut unique = seen.clone();
            unique.sort();
            unique.dedup();
            if seen.len() != 4 || unique.len() != 4 {
                return Err(format!("expected 4 different hashes over two runs: {seen:?}").into());
            }
            Ok(())
        },
    ));
    trials.push(Trial::test("std_env_from_a_config_file", || {
        let dir = TempDir::new("std-env")?;
        let file = dir.file(
            "env.toml",
            &format!(
                "timeout = {GUEST_TIMEOUT_SECS}\n\n[[guest]]\nimage = '{}'\nname = \"std\"\n\
                 args = [\"env-clock\", \"GREETING\", \"LANG\"]\n\
                 env = {{ GREETING = \"from the file\", LANG = \"C.UTF-8\" }}\n",
                std_guest("std-demo")?.display()
            ),
        )?;
        // One guest: its output has no `[std]` prefix.
        let run = activm(&[file.as_os_str()])?.expect_code(0)?;
        check_clock(&run)?;
        run.stdout_has("\nGREETING: Some(\"from the file\")\n")?
            .stdout_has("\nLANG: Some(\"C.UTF-8\")\n")?
            .stdout_has("\nvars: 2\n")?;
        Ok(())
    }));
    trials
}

/// `activm run OPTIONS` with an image that must never be booted; the exit status and a piece
/// of stderr.
fn refused(options: &[&str], status: i32, message: &str) -> Result<(), Failed> {
    let output = Command::new(ACTIVM)
        .arg("run")
        .arg("/nonexistent/never-booted")
        .args(options)
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    Run::from(output).expect_code(status)?.stderr_has(message)?;
    Ok(())
}

/// Need no KVM: bad values are refused (status 2, a usage error) before a guest is loaded.
pub(crate) fn input_tests() -> Vec<Trial> {
    let long = format!("BIG={}", "x".repeat(5000));
    let fits_alone = format!("BIG={}", "x".repeat(4000));
    let cases: Vec<(&'static str, Vec<String>, &'static str)> = vec![
        (
            "std_env_refuses_a_value_without_equals",
            vec!["--env".into(), "GREETING".into()],
            "\"GREETING\" is not KEY=VALUE",
        ),
        (
            "std_env_refuses_an_empty_key",
            vec!["--env".into(), "=value".into()],
            "the key is empty",
        ),
        (
            "std_env_refuses_a_key_given_twice",
            vec!["--env".into(), "A=1".into(), "--env".into(), "A=2".into()],
            "--env \"A\" is given twice",
        ),
        (
            "std_env_refuses_more_than_the_argument_block",
            vec!["--env".into(), long],
            "the limit is 4096",
        ),
        (
            "std_env_and_args_share_the_argument_block",
            vec!["--env".into(), fits_alone, "--".into(), "y".repeat(200)],
            "--env makes the guest arguments and environment take 4206 bytes; the limit is 4096",
        ),
    ];
    let mut trials: Vec<Trial> = cases
        .into_iter()
        .map(|(name, options, message)| {
            Trial::test(name, move || {
                let options: Vec<&str> = options.iter().map(String::as_str).collect();
                refused(&options, 2, message)
            })
        })
        .collect();
    trials.push(Trial::test("std_env_refused_in_a_config_file", || {
        let dir = TempDir::new("std-env-bad")?;
        let file = dir.file(
            "bad.toml",
            "[[guest]]\nimage = \"/nonexistent/never-booted\"\nenv = { \"A=B\" = \"x\" }\n",
        )?;
        activm(&[file.as_os_str()])?
            .expect_code(2)?
            .stderr_has("bad.toml: guest[0]: env key \"A=B\" contains '='")?;
        let file = dir.file(
            "nul.toml",
            "[[guest]]\nimage = \"/nonexistent/never-booted\"\nenv = { A = \"x\\u0000y\" }\n",
        )?;
        activm(&[file.as_os_str()])?
            .expect_code(2)?
            .stderr_has("nul.toml: guest[0]: env \"A=x\\0y\" contains a NUL byte")?;
        // Per guest, so not as a flag beside a file.
        activm(&["--env".as_ref(), "A=1".as_ref(), file.as_os_str()])?
            .expect_code(2)?
            .stderr_has("--env cannot be given with a configuration file: set `env`")?;
        let file = dir.file(
            "type.toml",
            "[[guest]]\nimage = \"/nonexistent/never-booted\"\nenv = [\"A=1\"]\n",
        )?;
        activm(&[file.as_os_str()])?
            .expect_code(2)?
            .stderr_has("guest[0].env: invalid type")?;
        Ok(())
    }));
    trials
}
