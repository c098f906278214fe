//! Integration tests: boot real guests under KVM with the `activm` binary and check what they
//! print and how they exit.
//!
//! Guests come from `cargo xtask build-guests` (the README's test command builds them first).
//! Without a usable `/dev/kvm` every test here is reported as *ignored*, with a banner on
//! stderr: never as passed; and where KVM must be there (`/dev/kvm` exists, or
//! `ACTIVM_REQUIRE_KVM=1` as CI sets) every one of them fails instead.

#[path = "kvm/exact.rs"]
mod exact;
#[path = "kvm/hang.rs"]
mod hang;
#[path = "kvm/hostile.rs"]
mod hostile;
#[path = "kvm/timeline.rs"]
mod timeline;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use activm::testing::{raw_guest, TempPath};
use exact::{rt_suite_exact, Setup};
use libtest_mimic::{Arguments, Failed, Trial};

#[path = "kvm/activations.rs"]
mod activations;
#[path = "kvm/blk.rs"]
mod blk;
#[path = "kvm/boot.rs"]
mod boot;
#[path = "kvm/config.rs"]
mod config;
#[path = "kvm/durability.rs"]
mod durability;
#[path = "kvm/inputs.rs"]
mod inputs;
#[path = "kvm/net.rs"]
mod net;
#[path = "kvm/net_opts.rs"]
mod net_opts;
#[path = "kvm/net_udp.rs"]
mod net_udp;
#[path = "kvm/placement.rs"]
mod placement;
#[path = "kvm/preempt_at.rs"]
mod preempt_at;
#[path = "kvm/security.rs"]
mod security;
#[path = "kvm/std_api.rs"]
mod std_api;
#[path = "kvm/std_async.rs"]
mod std_async;
#[path = "kvm/std_env.rs"]
mod std_env;
#[path = "kvm/std_files.rs"]
mod std_files;
#[path = "kvm/std_guests.rs"]
mod std_guests;

const ACTIVM: &str = env!("CARGO_BIN_EXE_activm");
/// Upper bound on any one guest run, so a broken guest fails the test instead of hanging it.
const GUEST_TIMEOUT_SECS: &str = "60";

fn guest_dir() -> PathBuf {
    match std::env::var_os("ACTIVM_GUEST_DIR") {
        Some(dir) => dir.into(),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/target/x86_64-activm/release")
        }
    }
}

/// Each thread of `pid`: its name and the value of the status line `field` (e.g. `"Seccomp:"`).
fn thread_status_field(pid: u32, field: &str) -> Result<Vec<(String, String)>, Failed> {
    let mut rows = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let line = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        rows.push((line("Name:"), line(field)));
    }
    Ok(rows)
}

fn guest(name: &str) -> Result<PathBuf, Failed> {
    let path = guest_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "guest {} is missing: run `cargo xtask build-guests` first",
            path.display()
        )
        .into())
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn expect_code(self, code: i32) -> Result<Run, Failed> {
        if self.code == code {
            Ok(self)
        } else {
            Err(format!(
                "exit status {} (wanted {code})\n--- stdout\n{}--- stderr\n{}",
                self.code, self.stdout, self.stderr
            )
            .into())
        }
    }

    fn stdout_has(self, text: &str) -> Result<Run, Failed> {
        if self.stdout.contains(text) {
            Ok(self)
        } else {
            Err(format!(
                "stdout lacks {text:?}\n--- stdout\n{}--- stderr\n{}",
                self.stdout, self.stderr
            )
            .into())
        }
    }

    fn stderr_has(self, text: &str) -> Result<Run, Failed> {
        if self.stderr.contains(text) {
            Ok(self)
        } else {
            Err(format!(
                "stderr lacks {text:?}\n--- stdout\n{}--- stderr\n{}",
                self.stdout, self.stderr
            )
            .into())
        }
    }
}

/// `activm run <image> <options> -- <guest args>`.
fn activm_run(image: &Path, options: &[&str], guest_args: &[&str]) -> Result<Run, Failed> {
    activm_run_within(GUEST_TIMEOUT_SECS, image, options, guest_args)
}

/// [`activm_run`] with the guest's `--timeout` (seconds) given.
fn activm_run_within(
    timeout_secs: &str,
    image: &Path,
    options: &[&str],
    guest_args: &[&str],
) -> Result<Run, Failed> {
    let mut cmd = Command::new(ACTIVM);
    cmd.arg("run")
        .arg(image)
        .args(["--timeout", timeout_secs])
        .args(options);
    if !guest_args.is_empty() {
        cmd.arg("--").args(guest_args);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    Ok(Run::from(output))
}

fn selftest(options: &[&str], guest_args: &[&str]) -> Result<Run, Failed> {
    activm_run(&guest("selftest")?, options, guest_args)
}

/// A temporary file holding `bytes`, removed when dropped.
fn temp_image(name: &str, bytes: &[u8]) -> Result<TempPath, Failed> {
    Ok(TempPath::with_contents(name, bytes)?)
}

fn demo_smp(vcpus: u32) -> Result<(), Failed> {
    let n = vcpus.to_string();
    let mut run = activm_run(&guest("demo")?, &["--vcpus", &n], &[])?.expect_code(0)?;
    for i in 0..vcpus {
        run = run.stdout_has(&format!("hello from vCPU {i} of {vcpus} at CPL3\n"))?;
    }
    run.stdout_has(&format!("all {vcpus} vCPUs reported"))?;
    Ok(())
}

/// A zeroed disk image of `mib` MiB, removed when dropped.
fn temp_disk(name: &str, mib: u64) -> Result<TempPath, Failed> {
    Ok(TempPath::zeroed(&format!("{name}.img"), mib << 20)?)
}

/// `NAME=count` from the `--stats` upcall line.
fn upcall_count(stderr: &str, name: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with("upcalls:"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.parse().ok())
}

/// A fresh temporary directory for configuration files, removed with its contents when
/// dropped (by its `TempPath`).
struct TempDir(TempPath);

impl TempDir {
    fn new(name: &str) -> Result<TempDir, Failed> {
        Ok(TempDir(TempPath::dir(name)?))
    }

    /// Write `text` to `name` in the directory; returns its path.
    fn file(&self, name: &str, text: &str) -> Result<PathBuf, Failed> {
        let path = self.0.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(path)
    }

    /// Link guest `app` into the directory, so a file there can name it `app`.
    fn link_guest(&self, app: &str) -> Result<(), Failed> {
        let link = self.0.join(app);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(guest(app)?, &link)
            .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
        Ok(())
    }

    /// An empty disk image of `mib` MiB named `name` in the directory.
    fn disk(&self, name: &str, mib: u64) -> Result<(), Failed> {
        let path = self.0.join(name);
        let file = std::fs::File::create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        file.set_len(mib << 20)
            .map_err(|e| format!("cannot size {}: {e}", path.display()))?;
        Ok(())
    }
}

/// `activm run OPTIONS...` (no timeout added: the files under test set theirs).
fn activm(options: &[&std::ffi::OsStr]) -> Result<Run, Failed> {
    let output = Command::new(ACTIVM)
        .arg("run")
        .args(options)
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    Ok(Run::from(output))
}

/// `NAME=count` from the `--stats` upcall line of the guest labelled `[who]`.
fn guest_upcall_count(stderr: &str, who: &str, name: &str) -> Option<u64> {
    let prefix = format!("[{who}] ");
    let lines: String = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| format!("{l}\n"))
        .collect();
    upcall_count(&lines, name)
}

fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = boot::kvm_tests();
    trials.extend(blk::blk_tests());
    trials.extend(durability::tests());
    trials.extend(activations::activation_tests());
    trials.extend(config::toml_tests());
    trials.extend(hostile::hostile_tests());
    trials.extend(security::security_tests());
    trials.extend(placement::tests());
    trials.extend(std_guests::tests());
    trials.extend(std_api::tests());
    trials.extend(std_async::tests());
    trials.extend(std_env::tests());
    trials.extend(std_files::tests());
    trials.extend(net::tests());
    trials.extend(net_udp::tests());
    trials.extend(net_opts::tests());
    trials.extend(timeline::tests());
    trials.extend(hang::tests());
    trials.extend(preempt_at::tests());
    if let Err(why) = kvm_usable() {
        if let Some(required) = exact::kvm_required() {
            // A machine with KVM (or CI) must not pass by skipping: every KVM test fails.
            eprintln!("\n!!!!!!!! /dev/kvm is not usable ({why}) but {required}: {} KVM tests FAIL !!!!!!!!\n", trials.len());
            let why = format!("/dev/kvm is not usable ({why}) but {required}");
            trials = trials
                .into_iter()
                .map(|t| {
                    let why = why.clone();
                    Trial::test(t.name().to_string(), move || Err(why.into()))
                })
                .collect();
        } else {
            eprintln!("\n!!!!!!!! /dev/kvm is not usable ({why}): {} KVM tests are SKIPPED (shown as ignored) !!!!!!!!\n", trials.len());
            trials = trials
                .into_iter()
                .map(|t| t.with_ignored_flag(true))
                .collect();
        }
    }
    trials.extend(inputs::input_tests());
    trials.extend(inputs::toml_input_tests());
    trials.extend(std_env::input_tests());
    libtest_mimic::run(&args, trials).exit();
}
