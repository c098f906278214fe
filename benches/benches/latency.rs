//! Request latency beside a batch job: a server guest (`iobench serve-latency`: open-loop
//! requests that wait on a timer until they arrive, read 4 KiB from a slow disk, then compute)
//! and a batch guest (`nbody nbody-for`: N-body stepping for a fixed time) share 2 physical CPUs
//! in one activm process. Reports the server's p50 / p99 / p99.9 latency (measured by the guest
//! with the TSC, from each request's arrival to the end of its computation) and the batch job's
//! throughput, under activations, host-sched and the time slicer ([`activm_benches::modes`]),
//! on the same pinned CPUs. The latency CDF goes to `target/bench/latency-cdf.svg`.
//!
//! `cargo xtask bench latency`; `ACTIVM_BENCH_QUICK=1` for a short smoke run.

use std::time::Duration;

use activm::config::DiskConfig;
use activm::{MonitorOptions, VmConfig};
use activm_benches::modes::{pin_and_report, Mode};
use activm_benches::{field, guest, plot, run_captured, stats::summary, TempDisk};

const PCPUS: usize = 2;
const SERVER_VCPUS: u32 = 4;
const SERVER_THREADS: u32 = 8;
const BATCH_VCPUS: u32 = 2;
const INTERVAL_US: u64 = 500;
const WORK: u64 = 20;
const DISK_LATENCY_US: u64 = 100;

/// What one run measured.
struct Sample {
    p50: f64,
    p99: f64,
    p999: f64,
    /// Latency at each whole percentile.
    cdf: Vec<f64>,
    /// N-body steps per second (None without the batch guest).
    steps_per_s: Option<f64>,
}

fn run(mode: Mode, disk: &TempDisk, requests: u64, with_batch: bool) -> Result<Sample, String> {
    let run_ms = requests * INTERVAL_US / 1000;
    let server = VmConfig {
        name: Some("server".into()),
        vcpus: SERVER_VCPUS,
        args: [
            "serve-latency".to_string(),
            SERVER_THREADS.to_string(),
            requests.to_string(),
            INTERVAL_US.to_string(),
            WORK.to_string(),
        ]
        .to_vec(),
        disk: Some(DiskConfig {
            path: disk.0.clone(),
            read_only: true,
            latency: Duration::from_micros(DISK_LATENCY_US),
            inline_wait: activm::config::DEFAULT_INLINE_WAIT,
        }),
        // Served before the batch guest by activm's allocator (no effect under host-sched).
        latency_critical: true,
        ..VmConfig::new(guest("iobench"))
    };
    let batch = VmConfig {
        name: Some("batch".into()),
        vcpus: BATCH_VCPUS,
        args: [
            "nbody-for",
            "1024",
            &run_ms.to_string(),
            &BATCH_VCPUS.to_string(),
        ]
        .map(String::from)
        .to_vec(),
        ..VmConfig::new(guest("nbody"))
    };
    let configs = if with_batch {
        vec![server, batch]
    } else {
        vec![server]
    };
    let options = MonitorOptions {
        timeout: Some(Duration::from_secs(120)),
        ..mode.options(PCPUS)
    };
    let outputs = run_captured(&configs, &options)?;
    let text = &outputs[0];
    let value = |key: &str| field(text, key).ok_or_else(|| format!("no {key}= in {text:?}"));
    let cdf = text
        .find("CDF us=")
        .map(|at| &text[at + 7..])
        .and_then(|rest| rest.lines().next())
        .map(|line| {
            line.split(',')
                .filter_map(|v| v.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(Sample {
        p50: value("p50_us")?,
        p99: value("p99_us")?,
        p999: value("p999_us")?,
        cdf,
        steps_per_s: outputs.get(1).and_then(|text| field(text, "steps_per_s")),
    })
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let rounds = if quick { 1 } else { 3 };
    let requests: u64 = if quick { 1000 } else { 4000 };
    pin_and_report(PCPUS);
    let disk = match TempDisk::new("activm-bench-latency") {
        Ok(disk) => disk,
        Err(e) => return println!("latency: {e}"),
    };
    println!("request latency beside a batch job, on {PCPUS} physical CPUs, one activm process:");
    println!(
        "  server: {SERVER_VCPUS} vCPUs, {SERVER_THREADS} threads, a request every {INTERVAL_US} us ({requests} in all); each waits for its"
    );
    println!(
        "  arrival (timer), reads 4 KiB from a disk with {DISK_LATENCY_US} us latency, hashes it {WORK} times"
    );
    println!("  batch: N-body, 1024 bodies, {BATCH_VCPUS} vCPUs and threads, stepping for as long as the server runs");
    println!(
        "latency from arrival to done (us), medians of {rounds} rounds; batch in N-body steps/s\n"
    );
    println!(
        "  {:<28} {:>9} {:>9} {:>9} {:>12}",
        "mode", "p50", "p99", "p99.9", "batch steps/s"
    );
    let mut cdfs: Vec<plot::Series> = Vec::new();
    let rows: Vec<(String, Mode, bool)> = Mode::ALL
        .iter()
        .map(|&m| (format!("{} + batch", m.name()), m, true))
        .chain([(
            "server alone (activations)".to_string(),
            Mode::Activations,
            false,
        )])
        .collect();
    for (name, mode, with_batch) in rows {
        let mut samples = Vec::new();
        for _ in 0..rounds {
            match run(mode, &disk, requests, with_batch) {
                Ok(sample) => samples.push(sample),
                Err(e) => println!("  {name:<28} failed: {e}"),
            }
        }
        if samples.is_empty() {
            println!("  {name:<28} n/a");
            continue;
        }
        let median = |f: &dyn Fn(&Sample) -> Option<f64>| {
            let mut v: Vec<f64> = samples.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| summary(&mut v).0)
        };
        let [p50, p99, p999] = [
            median(&|s| Some(s.p50)),
            median(&|s| Some(s.p99)),
            median(&|s| Some(s.p999)),
        ]
        .map(Option::unwrap_or_default);
        let steps = median(&|s| s.steps_per_s)
            .map(|v| format!("{v:.1}"))
            .unwrap_or_else(|| "-".into());
        println!("  {name:<28} {p50:>9.0} {p99:>9.0} {p999:>9.0} {steps:>12}");
        // The CDF of the round whose p99 is the median one.
        samples.sort_by(|a, b| a.p99.total_cmp(&b.p99));
        let cdf = &samples[(samples.len() - 1) / 2].cdf;
        let points = cdf
            .iter()
            .enumerate()
            .map(|(p, &us)| (us, p as f64 / 100.0))
            .collect();
        cdfs.push((name, points));
    }
    let path = plot::out_dir().join("latency-cdf.svg");
    plot::report(
        plot::lines(
            &path,
            "server request latency beside a batch job (CDF)",
            ("latency, us (log)", "fraction of requests"),
            &cdfs,
            true,
        ),
        &path,
    );
}
