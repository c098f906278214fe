//! Keeping processors busy while I/O is in flight (seed 001, section 3.1): a guest serves
//! requests that each wait for a slow block device (`--io-latency`) and then compute, on 2
//! physical CPUs. By default the guest submits requests asynchronously (completion ring: the
//! vCPU never blocks); with `--rt-blk-async=off` ("blocking") a vCPU blocks in the VMM: with
//! activations it hands its processor to a new activation (BLOCKED / UNBLOCKED upcalls), an
//! oblivious guest loses the vCPU while it waits. Host-scheduled = what a user would pick
//! instead: plain KVM vCPU threads that Linux schedules (`--no-activations --pcpus 64`), with
//! 8 or 16 vCPUs, blocking (today's guests) and asynchronous. The baseline is the same
//! computation without the device, measured in the same run. Then the cost of one request.
//!
//! `cargo xtask bench io`; `ACTIVM_BENCH_QUICK=1` for a short smoke run.

use std::time::Duration;

use activm::devices::blk::DiskConfig;
use activm::{MonitorOptions, Outcome, VmConfig};
use activm_benches::{field, guest, stats::summary, Captured};

/// A sparse disk image, removed when dropped.
struct Disk(std::path::PathBuf);

impl Disk {
    fn new() -> Disk {
        let path = std::env::temp_dir().join(format!("activm-bench-io-{}.img", std::process::id()));
        let file = std::fs::File::create(&path).expect("create the disk image");
        file.set_len(64 << 20).expect("size the disk image");
        Disk(path)
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One guest of `iobench` with `args`; returns the `key=` value of its RESULT line.
fn run(
    disk: Option<(&Disk, u64)>,
    vcpus: u32,
    activations: bool,
    args: &[&str],
    key: &str,
) -> Result<f64, String> {
    run_on(disk, vcpus, activations, 2, args, key)
}

/// `run` with `pcpus` physical CPUs for the allocator (64: every vCPU always holds one, so
/// Linux schedules the vCPU threads: plain host-scheduled KVM).
fn run_on(
    disk: Option<(&Disk, u64)>,
    vcpus: u32,
    activations: bool,
    pcpus: usize,
    args: &[&str],
    key: &str,
) -> Result<f64, String> {
    let config = VmConfig {
        vcpus,
        args: args.iter().map(|s| s.to_string()).collect(),
        disk: disk.map(|(disk, latency_us)| DiskConfig {
            path: disk.0.clone(),
            read_only: false,
            latency: Duration::from_micros(latency_us),
        }),
        ..VmConfig::new(guest("iobench"))
    };
    let console = Captured::default();
    let options = MonitorOptions {
        pcpus,
        activations,
        timeout: Some(Duration::from_secs(120)),
        ..MonitorOptions::default()
    };
    let reports = activm::run_guests(&[config], vec![Box::new(console.clone())], &options)
        .map_err(|e| e.to_string())?;
    if reports[0].outcome != Outcome::Exited(0) {
        return Err(format!("{:?}: {}", reports[0].outcome, console.text()));
    }
    field(&console.text(), key).ok_or_else(|| format!("no {key}= in {:?}", console.text()))
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let rounds = if quick { 1 } else { 3 };
    let disk = Disk::new();
    let latency_us = 1000;
    let requests = if quick { "100" } else { "400" };
    let serve = ["serve", "16", requests, "100", "20"];
    let cpu_only = ["serve-cpu", "16", requests, "100", "20"];
    println!("I/O overlap on 2 physical CPUs: 16 threads serve {requests} requests; each reads 4 KiB from a device");
    println!("with {latency_us} us latency, hashes it (~0.5 ms), then updates a table under one mutex (~5 us)");
    println!("baseline: the same work without the device; utilization = baseline / time; medians of {rounds} rounds\n");
    // (name, vCPUs, activations, allocator pcpus, asynchronous requests); pcpus 64 =
    // host-scheduled KVM (every vCPU thread always runs, Linux schedules them). "blocking" =
    // the guest runtime's `--rt-blk-async=off`: each request blocks its vCPU in the VMM.
    let configs: [(&str, u32, bool, usize, bool); 8] = [
        ("activations, 8 vCPUs (asynchronous)", 8, true, 2, true),
        (
            "activations, 8 vCPUs, blocking (BLOCKED/UNBLOCKED)",
            8,
            true,
            2,
            false,
        ),
        ("oblivious, 2 vCPUs (asynchronous)", 2, false, 2, true),
        (
            "oblivious, 8 vCPUs, VMM-sliced (asynchronous)",
            8,
            false,
            2,
            true,
        ),
        ("host-scheduled, 8 vCPUs (asynchronous)", 8, false, 64, true),
        (
            "host-scheduled, 16 vCPUs (asynchronous)",
            16,
            false,
            64,
            true,
        ),
        ("host-scheduled, 8 vCPUs, blocking", 8, false, 64, false),
        ("host-scheduled, 16 vCPUs, blocking", 16, false, 64, false),
    ];
    let mut baseline = Vec::new();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let blocking_serve: Vec<&str> = std::iter::once("--rt-blk-async=off")
        .chain(serve.iter().copied())
        .collect();
    for _ in 0..rounds {
        match run(None, 2, true, &cpu_only, "ms") {
            Ok(ms) => baseline.push(ms),
            Err(e) => println!("  baseline failed: {e}"),
        }
        for (i, &(_, vcpus, activations, pcpus, asynchronous)) in configs.iter().enumerate() {
            let args: &[&str] = if asynchronous {
                &serve
            } else {
                &blocking_serve
            };
            match run_on(
                Some((&disk, latency_us)),
                vcpus,
                activations,
                pcpus,
                args,
                "ms",
            ) {
                Ok(ms) => times[i].push(ms),
                Err(e) => println!("  {} failed: {e}", configs[i].0),
            }
        }
    }
    if baseline.is_empty() {
        println!("  no baseline: the guest without a device failed");
        return;
    }
    let base = summary(&mut baseline).0;
    println!(
        "  {:<52} {:>9} {:>12}",
        "configuration", "ms", "utilization"
    );
    println!(
        "  {:<52} {base:>9.1} {:>11.0}%",
        "no device (2 vCPUs)", 100.0
    );
    let mut medians = Vec::new();
    for (i, (name, _, _, _, _)) in configs.iter().enumerate() {
        if times[i].is_empty() {
            println!("  {name:<52} n/a");
            medians.push(f64::NAN);
            continue;
        }
        let ms = summary(&mut times[i]).0;
        medians.push(ms);
        println!("  {name:<52} {ms:>9.1} {:>11.0}%", 100.0 * base / ms);
    }
    let best_host = |a: usize, b: usize| medians[a].min(medians[b]);
    println!(
        "  activations (asynchronous) vs its blocking self: {:.2}x; vs oblivious 2 vCPUs: {:.2}x",
        medians[1] / medians[0],
        medians[2] / medians[0]
    );
    println!(
        "  activations (asynchronous) vs the best host-scheduled: {:.2}x (asynchronous guests), {:.2}x (blocking guests)",
        best_host(4, 5) / medians[0],
        best_host(6, 7) / medians[0]
    );

    // One thread, an idle guest: what a blocking request costs beyond the device's own time.
    let reads = if quick { "200" } else { "1000" };
    println!("\none 4 KiB read, 1 thread on 2 vCPUs (us per read, medians of {rounds}); async = completion");
    println!(
        "ring (the default), block = --rt-blk-async=off (BLOCKED/UNBLOCKED, or the vCPU sleeps)"
    );
    println!(
        "  {:<44} {:>11} {:>11} {:>11} {:>11}",
        "device", "act. async", "obl. async", "act. block", "obl. block"
    );
    for (name, latency) in [
        ("in the host page cache (completes in the exit)", None),
        ("1 us latency", Some(1)),
        ("1 ms latency", Some(1000)),
    ] {
        let mut row = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..rounds {
            for (j, (activations, asynchronous)) in
                [(true, true), (false, true), (true, false), (false, false)]
                    .into_iter()
                    .enumerate()
            {
                let reads = if latency == Some(1000) { "100" } else { reads };
                let async_arg = if asynchronous {
                    "--rt-blk-async=on"
                } else {
                    "--rt-blk-async=off"
                };
                if let Ok(us) = run(
                    Some((&disk, latency.unwrap_or(0))),
                    2,
                    activations,
                    &[async_arg, "latency", reads],
                    "per_read_us",
                ) {
                    row[j].push(us);
                }
            }
        }
        let cells = row.map(|mut v| {
            if v.is_empty() {
                "n/a".to_string()
            } else {
                format!("{:.1}", summary(&mut v).0)
            }
        });
        println!(
            "  {name:<44} {:>11} {:>11} {:>11} {:>11}",
            cells[0], cells[1], cells[2], cells[3]
        );
    }
}
