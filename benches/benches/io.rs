//! Keeping processors busy while I/O is in flight (Anderson et al. 1992, section 3.1): a guest serves
//! requests that each wait for a slow block device (`--io-latency`) and then compute, on 2
//! physical CPUs (pinned). With scheduler activations a vCPU blocked in the VMM hands its
//! processor to a new activation (BLOCKED / UNBLOCKED upcalls); an oblivious guest loses the vCPU
//! while it waits, unless it has more vCPUs than processors. Those extra vCPUs are either left to
//! the host's scheduler (`--host-sched`, plain KVM: the baseline a user would pick, with 8 and 16
//! vCPUs, the better one counting) or time-sliced by activm (`--no-activations`). Utilization is
//! against the same computation without the device, measured in the same run. Then the cost of
//! one request. The guest runtime submits requests asynchronously when the VMM offers it (a
//! completion ring: the vCPU never blocks, in every mode), through a submission ring (no exit
//! per request while the VMM looks at the ring on its own; when it does not, the request is
//! taken back and goes by one `blk_submit` exit); rows marked "blocking" run it with
//! `--rt-blk-async=off`, today's guests: each request blocks its vCPU in the VMM. Two more rows
//! make one `blk_submit` exit per request (`--rt-blk-ring=off`) or ring the doorbell with an
//! ioeventfd store that wakes the VMM's consumer thread (`--rt-blk-doorbell-exit=off`). At 1 us latency a request,
//! blocking or not, completes inside its exit (the two-phase wait, `--io-inline-wait`,
//! `docs/activations.md`): that row shows whether anything of the cost of blocking is left.
//!
//! `cargo xtask bench io`; `ACTIVM_BENCH_QUICK=1` for a short smoke run.

use std::time::Duration;

use activm::config::DiskConfig;
use activm::{MonitorOptions, VmConfig};
use activm_benches::modes::{pin_and_report, Mode};
use activm_benches::{field, guest, run_captured, stats::summary, TempDisk};

/// One guest of `iobench` with `args`; returns the `key=` value of its RESULT line.
fn run(
    disk: Option<(&TempDisk, u64)>,
    vcpus: u32,
    mode: Mode,
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
            inline_wait: activm::config::DEFAULT_INLINE_WAIT,
        }),
        ..VmConfig::new(guest("iobench"))
    };
    let options = MonitorOptions {
        timeout: Some(Duration::from_secs(120)),
        ..mode.options(2)
    };
    let text = run_captured(&[config], &options)?.remove(0);
    field(&text, key).ok_or_else(|| format!("no {key}= in {text:?}"))
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let rounds = if quick { 1 } else { 3 };
    let disk = match TempDisk::new("activm-bench-io") {
        Ok(disk) => disk,
        Err(e) => return println!("io: {e}"),
    };
    let latency_us = 1000;
    let requests = if quick { "100" } else { "400" };
    let serve = ["serve", "16", requests, "100", "20"];
    let cpu_only = ["serve-cpu", "16", requests, "100", "20"];
    pin_and_report(2);
    println!("I/O overlap on 2 physical CPUs: 16 threads serve {requests} requests; each reads 4 KiB from a device");
    println!("with {latency_us} us latency, hashes it (~0.5 ms), then updates a table under one mutex (~5 us)");
    println!("baseline: the same work without the device; utilization = baseline / time; medians of {rounds} rounds\n");
    // (name, vCPUs, mode, runtime arguments before the app's)
    const ASYNC: &[&str] = &[];
    const BLOCKING: &[&str] = &["--rt-blk-async=off"];
    let configs: [(&str, u32, Mode, &[&str]); 11] = [
        (
            "activations, 8 vCPUs (activations to spare)",
            8,
            Mode::Activations,
            ASYNC,
        ),
        (
            "host-sched, 8 vCPUs (Linux schedules them)",
            8,
            Mode::HostSched,
            ASYNC,
        ),
        ("host-sched, 16 vCPUs", 16, Mode::HostSched, ASYNC),
        (
            "time slicer, 2 vCPUs (one per processor)",
            2,
            Mode::TimeSlicer,
            ASYNC,
        ),
        (
            "time slicer, 8 vCPUs (time-sliced by activm)",
            8,
            Mode::TimeSlicer,
            ASYNC,
        ),
        ("time slicer, 16 vCPUs", 16, Mode::TimeSlicer, ASYNC),
        (
            "activations, 8 vCPUs, blocking",
            8,
            Mode::Activations,
            BLOCKING,
        ),
        (
            "host-sched, 8 vCPUs, blocking",
            8,
            Mode::HostSched,
            BLOCKING,
        ),
        (
            "host-sched, 16 vCPUs, blocking",
            16,
            Mode::HostSched,
            BLOCKING,
        ),
        (
            "activations, 8 vCPUs, one blk_submit exit per request",
            8,
            Mode::Activations,
            &["--rt-blk-ring=off"],
        ),
        (
            "activations, 8 vCPUs, ring, ioeventfd doorbell",
            8,
            Mode::Activations,
            &["--rt-blk-doorbell-exit=off"],
        ),
    ];
    let mut baseline = Vec::new();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        match run(None, 2, Mode::Activations, &cpu_only, "ms") {
            Ok(ms) => baseline.push(ms),
            Err(e) => println!("  baseline failed: {e}"),
        }
        for (i, &(_, vcpus, mode, runtime)) in configs.iter().enumerate() {
            let args: Vec<&str> = runtime.iter().chain(&serve).copied().collect();
            match run(Some((&disk, latency_us)), vcpus, mode, &args, "ms") {
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
    for (i, (name, _, _, _)) in configs.iter().enumerate() {
        if times[i].is_empty() {
            println!("  {name:<52} n/a");
            medians.push(f64::NAN);
            continue;
        }
        let ms = summary(&mut times[i]).0;
        medians.push(ms);
        println!("  {name:<52} {ms:>9.1} {:>11.0}%", 100.0 * base / ms);
    }
    let best = |modes: &[usize]| modes.iter().map(|&i| medians[i]).fold(f64::NAN, f64::min);
    let (host, slicer) = (best(&[1, 2]), best(&[3, 4, 5]));
    println!(
        "  activations vs host-sched (best of 8, 16 vCPUs): {:.2}x; vs time slicer (best of 2, 8, 16 vCPUs): {:.2}x (above 1: activations faster)",
        host / medians[0],
        slicer / medians[0]
    );
    println!(
        "  ceiling: host-sched's best is at {:.0}% utilization, so no mode can be more than {:.2}x faster than it",
        100.0 * base / host,
        host / base
    );
    println!(
        "  with blocking requests, activations vs host-sched (best of 8, 16 vCPUs): {:.2}x; activations' asynchronous requests vs its blocking ones: {:.2}x",
        best(&[7, 8]) / medians[6],
        medians[6] / medians[0]
    );
    println!(
        "  activations: submission ring vs one blk_submit exit per request: {:.2}x; its doorbell as an exit vs an ioeventfd store: {:.2}x (above 1: the first faster)",
        medians[9] / medians[0],
        medians[10] / medians[0]
    );

    // One thread, an idle guest: what a blocking request costs beyond the device's own time.
    let reads = if quick { "200" } else { "1000" };
    println!(
        "\none 4 KiB read, 1 thread on 2 vCPUs (us per read, medians of {rounds}); the first three"
    );
    println!("columns submit asynchronously (through the submission ring), \"act. exit\" with one");
    println!("blk_submit exit each, the last two block (--rt-blk-async=off)");
    println!(
        "  {:<44} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "device", "activations", "host-sched", "slicer", "act. exit", "act. block", "host block"
    );
    let columns: [(Mode, &[&str]); 6] = [
        (Mode::Activations, &[]),
        (Mode::HostSched, &[]),
        (Mode::TimeSlicer, &[]),
        (Mode::Activations, &["--rt-blk-ring=off"]),
        (Mode::Activations, &["--rt-blk-async=off"]),
        (Mode::HostSched, &["--rt-blk-async=off"]),
    ];
    for (name, latency) in [
        ("in the host page cache (completes in the exit)", None),
        ("1 us latency", Some(1)),
        ("1 ms latency", Some(1000)),
    ] {
        let mut row: [Vec<f64>; 6] = Default::default();
        for _ in 0..rounds {
            for (j, &(mode, runtime)) in columns.iter().enumerate() {
                let reads = if latency == Some(1000) { "100" } else { reads };
                let args: Vec<&str> = runtime.iter().chain(&["latency", reads]).copied().collect();
                if let Ok(us) = run(
                    Some((&disk, latency.unwrap_or(0))),
                    2,
                    mode,
                    &args,
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
            "  {name:<44} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
        );
    }
}
