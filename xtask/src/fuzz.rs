//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` (libFuzzer through
//! `libfuzzer-sys`). The fuzz crate is its own workspace, built with SanitizerCoverage
//! instrumentation (stable `-C passes=sancov-module` flags, no sanitizer runtime needed: the
//! targets are safe Rust, so a bug shows as a panic or a failed assertion) into
//! `target/fuzz/`. Each target starts from its committed seeds in `fuzz/corpus/TARGET/`; what
//! it finds goes to `target/fuzz/corpus/TARGET/`, a crashing input to
//! `target/fuzz/artifacts/TARGET/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fuzz targets (`fuzz/fuzz_targets/NAME.rs`).
pub const TARGETS: &[&str] = &[
    "hypercall",
    "shared_area",
    "loader",
    "config",
    "ctl",
    "blk",
    "net_tx",
    "fs",
    "net",
];

/// The largest input libFuzzer makes for `target`. `net_tx`'s and `net`'s steps make system
/// calls, and a few hundred of them (1 KiB) wrap `net_tx`'s ring many times over.
fn max_len(target: &str) -> usize {
    match target {
        "net_tx" | "net" => 1024,
        _ => 4096,
    }
}

/// Seconds each target runs in `cargo xtask test`.
pub const SMOKE_SECONDS: u64 = 3;

/// SanitizerCoverage as cargo-fuzz sets it up for `--sanitizer none`, plus checked arithmetic.
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Cdebug-assertions -Coverflow-checks";

/// What one target's run did.
#[derive(Debug)]
pub struct Outcome {
    pub executions: u64,
    pub seconds: f64,
    /// The crashing input libFuzzer wrote, if it found one.
    pub crash: Option<String>,
}

/// `cargo xtask fuzz [TARGET] [--seconds N]`.
pub fn command(root: &Path, args: &[String]) -> Result<(), String> {
    let mut seconds = 60;
    let mut targets: Vec<&str> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = rest
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--seconds needs a whole number of seconds")?;
            }
            name => match TARGETS.iter().find(|t| **t == name) {
                Some(target) => targets.push(target),
                None => {
                    return Err(format!(
                        "unknown fuzz target `{name}` (targets: {})",
                        TARGETS.join(", ")
                    ))
                }
            },
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    run_targets(root, &targets, seconds)
}

/// Build the targets, run each for `seconds`, print what each did; an error if any crashed.
pub fn run_targets(root: &Path, targets: &[&str], seconds: u64) -> Result<(), String> {
    build(root)?;
    let mut crashed = Vec::new();
    for target in targets {
        let outcome = run_one(root, target, seconds)?;
        println!(
            "xtask: fuzz {target}: {} executions in {:.0} s, {} crashes{}",
            outcome.executions,
            outcome.seconds,
            outcome.crash.is_some() as u32,
            outcome
                .crash
                .as_deref()
                .map(|c| format!(" (input: {c})"))
                .unwrap_or_default()
        );
        if outcome.crash.is_some() {
            crashed.push(*target);
        }
    }
    match crashed.is_empty() {
        true => Ok(()),
        false => Err(format!("fuzz targets crashed: {}", crashed.join(", "))),
    }
}

fn host_triple() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

fn target_dir(root: &Path) -> PathBuf {
    root.join("target/fuzz")
}

fn build(root: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // An explicit --target keeps the flags off build scripts and proc macros. Not --locked:
    // fuzz/Cargo.lock follows the vmm crate's dependencies, which change without it.
    let status = Command::new(cargo)
        .current_dir(root.join("fuzz"))
        .env("RUSTFLAGS", RUSTFLAGS)
        .env("CARGO_TARGET_DIR", target_dir(root))
        .args(["build", "--release", "--bins", "--target"])
        .arg(host_triple())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("building the fuzz targets failed ({status})")),
    }
}

fn run_one(root: &Path, target: &str, seconds: u64) -> Result<Outcome, String> {
    let dir = target_dir(root);
    let binary = dir.join(host_triple()).join("release").join(target);
    let found = dir.join("corpus").join(target);
    let artifacts = dir.join("artifacts").join(target);
    for d in [&found, &artifacts] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let started = std::time::Instant::now();
    let child = Command::new(&binary)
        .arg(&found)
        .arg(root.join("fuzz/corpus").join(target))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-max_len={}", max_len(target)))
        .args(["-print_final_stats=1", "-timeout=10"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let pid = child.id();
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{target}: {e}"))?;
    // The targets' scratch files (disk images, ELF files) live in a directory named by pid.
    for base in [PathBuf::from("/dev/shm"), std::env::temp_dir()] {
        let _ = std::fs::remove_dir_all(base.join(format!("activm-fuzz-{pid}")));
    }
    let log = String::from_utf8_lossy(&out.stderr);
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let crash = log
        .lines()
        .find_map(|l| l.split("Test unit written to ").nth(1))
        .map(str::to_string);
    if crash.is_some() {
        eprintln!("{log}");
    } else if !out.status.success() {
        return Err(format!(
            "fuzz target {target} failed ({}):\n{log}",
            out.status
        ));
    }
    Ok(Outcome {
        executions: stat("number_of_executed_units").unwrap_or(0),
        seconds: started.elapsed().as_secs_f64(),
        crash,
    })
}
