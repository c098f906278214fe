//! Thread micro-benchmarks (issue 3): the activm guest runtime beside host Linux threads (NPTL,
//! futex locks) and Go goroutines, all measured in this one run, on the same operations with
//! the same parameters. Prints one table of medians with ratios to NPTL and to Go.
//!
//! `cargo xtask bench threads` (builds the guests first), or
//! `cargo bench -p activm-benches --bench threads [-- --quick]`; `ACTIVM_BENCH_QUICK=1` is
//! the same as `--quick` (fewer trials and creations: a smoke run of a few seconds).
//! `benches/README.md` explains every row.
//!
//! The three implementations take `OP key=value ...` and print `BENCH OP v1 v2 ...` (one value
//! per trial, nanoseconds); see `activm_benches::threads`:
//! * NPTL: `threadbench-nptl` (`baselines/nptl.rs`, a binary of this package);
//! * Go: `baselines/go`, built here with the local Go toolchain and run with GOMAXPROCS=2;
//! * activm: the guest `threadbench` booted through the activm library on 1 and on 2 vCPUs,
//!   i.e. `target/release/activm run threadbench --vcpus N -- OP key=value ...`.
//!
//! A column that cannot be measured says "n/a" and the reason is printed under the table.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use activm::{Outcome, VmConfig};
use activm_benches::stats::summary;
use activm_benches::threads::{build_go, fmt_ratio, fmt_value, parse_bench, run_with_limit, tail};

/// What a row's values are.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Unit {
    /// Nanoseconds per operation.
    Ns,
    /// Total milliseconds per trial.
    Ms,
}

/// One row of the table: an operation with its parameters.
#[derive(Debug)]
struct Row {
    label: String,
    op: &'static str,
    params: Vec<(&'static str, u64)>,
    unit: Unit,
    /// Time limit of one implementation's run of this row.
    limit: Duration,
    /// The column (index into [`COLUMNS`]) whose number means something else here; marked `*`
    /// and explained under the table.
    caveat: Option<usize>,
}

impl Row {
    fn args(&self) -> Vec<String> {
        std::iter::once(self.op.to_string())
            .chain(self.params.iter().map(|(k, v)| format!("{k}={v}")))
            .collect()
    }
}

/// A measured cell: median, p10, p90 (in the row's unit), or why there is none.
type Cell = Result<(f64, f64, f64), String>;

/// The TSC frequency the guest converts with (its `INFO tsc_khz=` line), from the first guest run.
static GUEST_TSC_KHZ: OnceLock<u64> = OnceLock::new();

/// The implementations, in table order.
const COLUMNS: [&str; 4] = ["NPTL", "Go", "activm 1v", "activm 2v"];
const GUEST_VCPUS: [u32; 2] = [1, 2];

fn rows(quick: bool) -> Vec<Row> {
    let q = |full: u64, smoke: u64| if quick { smoke } else { full };
    let micro = |label: &str, op: &'static str, trials: u64, iters: u64| Row {
        label: label.to_string(),
        op,
        params: vec![("trials", trials), ("iters", iters)],
        unit: Unit::Ns,
        limit: Duration::from_secs(60),
        // Yield on 2 vCPUs may not switch; the contended mutex on 1 vCPU hardly contends.
        caveat: match op {
            "yield" => Some(3),
            "mutex-contended" => Some(2),
            _ => None,
        },
    };
    let mut rows = vec![
        micro(
            "null fork (create+join)",
            "null-fork",
            q(31, 5),
            q(500, 100),
        ),
        micro(
            "signal-wait (round trip/2)",
            "signal-wait",
            q(21, 5),
            q(2000, 300),
        ),
        micro(
            "yield (2 threads, 1 CPU)",
            "yield",
            q(21, 5),
            q(20_000, 2000),
        ),
        micro(
            "mutex uncontended",
            "mutex",
            q(21, 5),
            q(1_000_000, 100_000),
        ),
        micro(
            "mutex contended (2 thr, per acq)",
            "mutex-contended",
            q(21, 5),
            q(100_000, 10_000),
        ),
    ];
    let total = q(100_000, 10_000);
    for (top, children) in [(1, 1), (4, 4), (20, 10)] {
        rows.push(Row {
            label: format!("create {top}x{children} ({}k thr, total)", total / 1000),
            op: "create",
            params: vec![
                ("trials", q(5, 1)),
                ("total", total),
                ("top", top),
                ("children", children),
            ],
            unit: Unit::Ms,
            limit: Duration::from_secs(120),
            caveat: None,
        });
    }
    for regions in [1, 4, 16] {
        rows.push(Row {
            label: format!(
                "contention 32 thr, {regions} region{} (total)",
                if regions == 1 { "" } else { "s" }
            ),
            op: "contention",
            params: vec![
                ("trials", q(11, 3)),
                ("total", 50_000),
                ("threads", 32),
                ("regions", regions),
            ],
            unit: Unit::Ms,
            limit: Duration::from_secs(60),
            caveat: None,
        });
    }
    rows
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick" || a == "quick")
        || std::env::var("ACTIVM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let started = Instant::now();
    let root = activm_benches::repo_root();

    let host_tsc_khz = host_tsc_khz();
    let nptl = PathBuf::from(env!("CARGO_BIN_EXE_threadbench-nptl"));
    let go = build_go(&root);
    let guest = find_guest(&root);
    if let Err(why) = &go {
        eprintln!("threads: Go column unavailable: {why}");
    }
    match &guest {
        Ok(elf) => {
            let age = std::fs::metadata(elf)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or("?".to_string(), |d| format!("{:.0}", d.as_secs_f64()));
            println!("activm guest: {} (built {age} s ago)", elf.display());
        }
        Err(why) => eprintln!("threads: activm columns unavailable: {why}"),
    }

    let rows = rows(quick);
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    for row in &rows {
        let args = row.args();
        eprintln!("threads: {}", args.join(" "));
        let mut line = Vec::new();
        // Row by row, every implementation in turn: a row's numbers are measured close in time.
        line.push(measure(row, "NPTL", || {
            run_with_limit(Command::new(&nptl).args(&args), row.limit)
        }));
        line.push(match &go {
            Ok(go) => measure(row, "Go", || {
                run_with_limit(
                    Command::new(go).args(&args).env("GOMAXPROCS", "2"),
                    row.limit,
                )
            }),
            Err(why) => Err(why.clone()),
        });
        for vcpus in GUEST_VCPUS {
            line.push(match &guest {
                Ok(elf) => measure(row, &format!("activm {vcpus} vCPU"), || {
                    run_guest(elf, vcpus, &args, row.limit)
                }),
                Err(why) => Err(why.clone()),
            });
        }
        cells.push(line);
    }
    print_table(&rows, &cells, quick, started.elapsed());
    print_std_table(&root, &rows, &cells);
    print_tsc_check(host_tsc_khz);
}

/// The std columns: the NPTL baseline's own code (`baselines/nptl.rs`) built as an activm std
/// guest (`guests/apps/std-threadbench`, activm-std) on 1 and 2 vCPUs, beside the activm-rt guest
/// on as many vCPUs measured above: what `std::thread`/`std::sync` cost over activm-rt's own API.
/// Both counts matter: on 1 vCPU activm-rt's uncontended mutex drops the bus lock (runtime.md,
/// "One vCPU, no bus lock"), which std's own futex mutex code cannot.
fn print_std_table(root: &Path, rows: &[Row], cells: &[Vec<Cell>]) {
    let elf = root.join("guests/target/x86_64-activm-std/release/std-threadbench");
    println!();
    if !elf.is_file() {
        println!(
            "std on activm: n/a ({} missing: cargo xtask build-guests --release)",
            elf.display()
        );
        return;
    }
    println!(
        "std on activm (std::thread/std::sync through activm-std); std/rt < 1 means std is faster"
    );
    println!(
        "{:<38} {:>4} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}",
        "op", "unit", "std 1v", "activm 1v", "std/rt", "std 2v", "activm 2v", "std/rt"
    );
    let value = |v: Option<f64>| v.map_or("n/a".to_string(), fmt_value);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => fmt_ratio(a / b),
        _ => "n/a".to_string(),
    };
    for (row, c) in rows
        .iter()
        .zip(cells)
        .filter(|(row, _)| row.unit == Unit::Ns)
    {
        let std: Vec<Option<f64>> = GUEST_VCPUS
            .iter()
            .map(|&vcpus| {
                measure(row, &format!("std {vcpus} vCPU"), || {
                    run_guest(&elf, vcpus, &row.args(), row.limit)
                })
                .ok()
                .map(|s| s.0)
            })
            .collect();
        let rt: Vec<Option<f64>> = (0..GUEST_VCPUS.len())
            .map(|i| c[2 + i].as_ref().ok().map(|s| s.0))
            .collect();
        println!(
            "{:<38} {:>4} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}",
            row.label,
            unit_name(row.unit),
            value(std[0]),
            value(rt[0]),
            ratio(std[0], rt[0]),
            value(std[1]),
            value(rt[1]),
            ratio(std[1], rt[1]),
        );
    }
}

/// Run one implementation on `row` and summarize its per-trial values.
fn measure(row: &Row, name: &str, run: impl FnOnce() -> Result<String, String>) -> Cell {
    let result = run().and_then(|out| parse_bench(&out, row.op));
    let cell = result.map(|mut values| {
        if row.unit == Unit::Ms {
            values.iter_mut().for_each(|v| *v /= 1e6);
        }
        summary(&mut values)
    });
    match &cell {
        Ok((median, _, _)) => eprintln!(
            "threads:   {name:<13} {:>10} {}",
            fmt_value(*median),
            unit_name(row.unit)
        ),
        Err(why) => eprintln!("threads:   {name:<13} n/a: {why}"),
    }
    cell
}

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Ns => "ns",
        Unit::Ms => "ms",
    }
}

/// The guest ELF `threadbench`, or why the activm columns cannot be measured.
fn find_guest(root: &Path) -> Result<PathBuf, String> {
    let dir = std::env::var_os("ACTIVM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("guests/target/x86_64-activm/release"));
    let elf = dir.join("threadbench");
    if elf.is_file() {
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            return Err(format!("/dev/kvm: {e}"));
        }
        return Ok(elf);
    }
    let why = if !root.join("guest-runtime/Cargo.toml").is_file() {
        "the guest runtime (guest-runtime/, activm-rt) does not exist yet"
    } else if !root.join("guests/apps/threadbench/Cargo.toml").is_file() {
        "the guest app guests/apps/threadbench does not exist"
    } else {
        "the guest app is not built (run `cargo xtask build-guests --release`; it must be a member of guests/Cargo.toml and build against activm-rt)"
    };
    Err(format!("{}: missing; {why}", elf.display()))
}

/// A console for the guest: everything it prints, kept in memory.
#[derive(Clone, Debug, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Boot the guest on `vcpus` vCPUs with `args` (what `activm run ELF --vcpus N -- ARGS` does)
/// and return its console output.
fn run_guest(elf: &Path, vcpus: u32, args: &[String], limit: Duration) -> Result<String, String> {
    let console = Capture::default();
    let config = VmConfig {
        vcpus,
        args: args.to_vec(),
        timeout: Some(limit),
        ..VmConfig::new(elf)
    };
    let boxed: Box<dyn Write + Send> = Box::new(console.clone());
    let report =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| activm::run(&config, boxed)))
            .map_err(|_| "the VMM panicked".to_string())?
            .map_err(|e| format!("activm run failed: {e}"))?;
    let out = String::from_utf8_lossy(&console.0.lock().expect("capture lock")).into_owned();
    match report.outcome {
        Outcome::Exited(0) => {
            let khz = out
                .split_whitespace()
                .find_map(|w| w.strip_prefix("tsc_khz="))
                .and_then(|v| v.parse().ok());
            if let Some(khz) = khz {
                let _ = GUEST_TSC_KHZ.set(khz);
            }
            Ok(out)
        }
        other => Err(format!(
            "{}{}",
            other
                .describe()
                .unwrap_or_else(|| format!("guest exited with {}", other.exit_code())),
            tail(&out)
        )),
    }
}

fn print_table(rows: &[Row], cells: &[Vec<Cell>], quick: bool, took: Duration) {
    let med = |c: &Cell| c.as_ref().ok().map(|s| s.0);
    let ratio = |a: &Cell, b: &Cell| match (med(a), med(b)) {
        (Some(a), Some(b)) if b > 0.0 => fmt_ratio(a / b),
        _ => "n/a".to_string(),
    };
    let value = |c: &Cell| med(c).map_or("n/a".to_string(), fmt_value);
    println!();
    println!(
        "thread benchmarks{}: medians over trials; activm/X < 1 means activm is faster",
        if quick {
            " (QUICK smoke run: fewer trials and creations)"
        } else {
            ""
        }
    );
    println!("host: NPTL = std::thread/std::sync (futex), Go GOMAXPROCS=2, activm guest on 1 and 2 vCPUs");
    let head = [
        "op", "unit", COLUMNS[0], COLUMNS[1], COLUMNS[2], COLUMNS[3], "1v/NPTL", "2v/NPTL",
        "1v/Go", "2v/Go",
    ];
    let line = |f: [String; 10]| {
        println!(
            "{:<38} {:>4} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]
        )
    };
    line(head.map(String::from));
    for (row, c) in rows.iter().zip(cells) {
        let mark = |col: usize, text: String| {
            if row.caveat == Some(col) {
                text + "*"
            } else {
                text
            }
        };
        line([
            row.label.clone(),
            unit_name(row.unit).to_string(),
            value(&c[0]),
            value(&c[1]),
            mark(2, value(&c[2])),
            mark(3, value(&c[3])),
            mark(2, ratio(&c[2], &c[0])),
            mark(3, ratio(&c[3], &c[0])),
            mark(2, ratio(&c[2], &c[1])),
            mark(3, ratio(&c[3], &c[1])),
        ]);
    }

    println!();
    println!("spread (p10..p90) and trials:");
    for (row, c) in rows.iter().zip(cells) {
        let trials = row
            .params
            .iter()
            .find(|(k, _)| *k == "trials")
            .map_or(0, |p| p.1);
        let spreads: Vec<String> = COLUMNS
            .iter()
            .zip(c)
            .filter_map(|(name, cell)| {
                let (_, p10, p90) = cell.as_ref().ok()?;
                Some(format!("{name} {}..{}", fmt_value(*p10), fmt_value(*p90)))
            })
            .collect();
        println!("  {:<38} {trials:>3}: {}", row.label, spreads.join(", "));
    }

    println!();
    println!("reading the table (* marks these cells):");
    println!("  yield, activm 2v: the two threads may sit on different vCPUs, where yield_now finds nothing");
    println!("    else to run and returns without a switch; only the 1v column (like NPTL pinned to one CPU,");
    println!("    Go with one P) measures a switch between two runnable threads.");
    println!(
        "  mutex contended, activm 1v: both threads share one vCPU, so they rarely contend; the 2v"
    );
    println!("    column is the contended case (NPTL and Go run on the host's 2 CPUs).");

    // Why cells are n/a: each distinct (column, reason) once, with the rows it hit.
    let mut reasons: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for (row, c) in rows.iter().zip(cells) {
        for (name, cell) in COLUMNS.iter().zip(c) {
            if let Err(why) = cell {
                match reasons.iter_mut().find(|r| r.0 == *name && r.1 == why) {
                    Some(r) => r.2.push(&row.label),
                    None => reasons.push((name, why, vec![&row.label])),
                }
            }
        }
    }
    if !reasons.is_empty() {
        println!();
        println!("n/a cells:");
        for (name, why, hit) in &reasons {
            let which = if hit.len() == rows.len() {
                "all rows".to_string()
            } else {
                hit.join("; ")
            };
            println!("  {name} ({which}): {why}");
        }
    }

    println!();
    println!("project targets:");
    // Whether the p10..p90 ranges of two cells overlap (the difference is within the noise).
    let overlap = |a: &Cell, b: &Cell| match (a, b) {
        (Ok((_, a10, a90)), Ok((_, b10, b90))) => a10 <= b90 && b10 <= a90,
        _ => false,
    };
    let verdict = |c: &Cell, base: &Cell, factor: f64| {
        let noise = if factor == 1.0 && overlap(c, base) {
            ", p10..p90 overlap"
        } else {
            ""
        };
        match (med(c), med(base)) {
            (Some(v), Some(b)) if v < b * factor => format!("met ({}{noise})", fmt_ratio(v / b)),
            (Some(v), Some(b)) => format!("MISSED ({}{noise})", fmt_ratio(v / b)),
            _ => "n/a".to_string(),
        }
    };
    let check = |what: &str, row: usize, base: usize, factor: f64| {
        let c = &cells[row];
        println!(
            "  {what:<24} activm 1v {}, activm 2v {}",
            verdict(&c[2], &c[base], factor),
            verdict(&c[3], &c[base], factor)
        );
    };
    check("null fork < NPTL/50", 0, 0, 1.0 / 50.0);
    check("null fork < Go/2", 0, 1, 0.5);
    check("signal-wait < Go", 1, 1, 1.0);
    // Only one vCPU gives "two runnable threads on one CPU", as NPTL (pinned) and Go (one P)
    // have: on two vCPUs the threads may each have a vCPU and a yield need not switch at all.
    println!(
        "  {:<24} activm 1v {} (2v: not a switch between two threads; not comparable)",
        "yield < Go",
        verdict(&cells[2][2], &cells[2][1], 1.0)
    );
    for (i, name) in [(2, "activm 1v"), (3, "activm 2v")] {
        let measured: Vec<(&Row, f64, f64, bool)> = rows
            .iter()
            .zip(cells)
            .filter_map(|(row, c)| Some((row, med(&c[i])?, med(&c[0])?, overlap(&c[i], &c[0]))))
            .collect();
        let slower: Vec<String> = measured
            .iter()
            .filter(|(_, v, n, _)| v > n)
            .map(|(row, v, n, noise)| {
                let noise = if *noise { ", p10..p90 overlap" } else { "" };
                format!("{} {}{noise}", row.label, fmt_ratio(v / n))
            })
            .collect();
        let verdict = if measured.is_empty() {
            "n/a".to_string()
        } else if slower.is_empty() {
            format!("met on all {} measured rows", measured.len())
        } else {
            format!(
                "MISSED on {} of {} measured rows: {}",
                slower.len(),
                measured.len(),
                slower.join("; ")
            )
        };
        println!("  {:<24} {name}: {verdict}", "nothing slower than NPTL");
    }
    println!();
    println!("took {:.0} s", took.as_secs_f64());
}

/// The host TSC frequency, measured against the monotonic clock over 100 ms.
fn host_tsc_khz() -> f64 {
    let t0 = Instant::now();
    let c0 = activm::rdtsc();
    std::thread::sleep(Duration::from_millis(100));
    let c1 = activm::rdtsc();
    (c1 - c0) as f64 / t0.elapsed().as_secs_f64() / 1000.0
}

/// The guest times with `rdtsc` and the frequency the VMM gave it, the hosts with the monotonic
/// clock: say whether the two agree.
fn print_tsc_check(host_khz: f64) {
    match GUEST_TSC_KHZ.get() {
        Some(&guest_khz) => {
            let off = (guest_khz as f64 / host_khz - 1.0) * 100.0;
            println!(
                "clocks: guest converts TSC ticks with {guest_khz} kHz (from the VMM); the host TSC \
                 measures {host_khz:.0} kHz against CLOCK_MONOTONIC ({off:+.2}%){}",
                if off.abs() > 1.0 {
                    ": WARNING, guest times are off by that much"
                } else {
                    ""
                }
            );
        }
        None => println!("clocks: no guest run reported its TSC frequency"),
    }
}
