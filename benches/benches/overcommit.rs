//! vCPU overcommit (Anderson et al. 1992, Table V): two copies of a parallel application run at
//! once on 2 physical CPUs with 2, 4 and 8 vCPUs each (2x, 4x, 8x overcommit), in three modes on
//! the same pinned CPUs ([`activm_benches::modes`]): scheduler activations; host-scheduled
//! (`--host-sched`: plain KVM, every vCPU thread left to Linux, the baseline a user would pick
//! instead); and activm's time slicer (`--no-activations`, the paper's oblivious baseline).
//! Each copy's speedup is over the same application alone on one vCPU. Plots go to
//! `target/bench/overcommit-*.svg`. Then the upcall latency beside the raw cost of a kick and of
//! an interrupt.
//!
//! `cargo xtask bench overcommit`; `ACTIVM_BENCH_QUICK=1` for a short smoke run;
//! `ACTIVM_BENCH_UPCALL_ONLY=1` for the upcall latency table alone (no Table V rows).

use std::time::Duration;

use activm::{MonitorOptions, Outcome, VmConfig};
use activm_benches::modes::{pin_and_report, Mode};
use activm_benches::{field, floor, guest, plot, run_captured, stats::summary, Captured};

/// Run `copies` copies of `image` with `guest_args` on `pcpus` physical CPUs in `mode`; returns
/// what each copy printed, or why it failed.
fn run(
    image: &std::path::Path,
    copies: usize,
    vcpus: u32,
    pcpus: usize,
    mode: Mode,
    guest_args: &[&str],
) -> Result<Vec<String>, String> {
    let config = VmConfig {
        vcpus,
        mem_size: 256 << 20,
        args: guest_args.iter().map(|s| s.to_string()).collect(),
        ..VmConfig::new(image)
    };
    let options = MonitorOptions {
        timeout: Some(Duration::from_secs(300)),
        ..mode.options(pcpus)
    };
    run_captured(&vec![config; copies], &options)
}

fn ms_of(outputs: &[String]) -> Result<Vec<f64>, String> {
    outputs
        .iter()
        .map(|o| field(o, "ms").ok_or_else(|| format!("no RESULT line in {o:?}")))
        .collect()
}

struct Workload {
    name: &'static str,
    args: Vec<String>,
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let rounds = if quick { 1 } else { 3 };
    let pcpus = 2;
    pin_and_report(pcpus);
    if std::env::var_os("ACTIVM_BENCH_UPCALL_ONLY").is_some() {
        return upcall_latency(quick);
    }
    println!(
        "vCPU overcommit, multiprogramming level 2: two copies of an app on {pcpus} physical CPUs"
    );
    println!("(Anderson et al. 1992, Table V: 6 processors, FastThreads on Topaz 1.29, original FastThreads 1.26, new FastThreads 2.45)");
    println!("speedup = time of one copy alone on 1 vCPU / time of each copy under multiprogramming; medians of {rounds} rounds");
    println!(
        "modes, same CPUs, same run: activations ({}), host-sched ({}), time slicer ({})",
        Mode::Activations.flags(),
        Mode::HostSched.flags(),
        Mode::TimeSlicer.flags()
    );
    println!("vs host = activations / host-sched, vs slicer = activations / time slicer (above 1: activations faster)");
    let workloads = [
        Workload {
            name: "N-body (O(N^2), {threads} threads, 2 barriers/step)",
            args: ["nbody", "2048", if quick { "4" } else { "20" }, "2"]
                .map(String::from)
                .to_vec(),
        },
        Workload {
            name: "lock-heavy (32 threads, 4 locks)",
            args: ["locks", "32", if quick { "100000" } else { "1000000" }, "4"]
                .map(String::from)
                .to_vec(),
        },
        Workload {
            name: "lock-heavy (32 threads, 1 lock)",
            args: ["locks", "32", if quick { "100000" } else { "1000000" }, "1"]
                .map(String::from)
                .to_vec(),
        },
    ];
    let Some(image) = activm_benches::guest_path("nbody") else {
        println!("\n  Table V rows: n/a (guest `nbody` is not built: it needs the guest runtime, guests/apps/nbody)");
        return upcall_latency(quick);
    };
    // speedups[workload][mode] = (overcommit level, median speedup) points for the plots.
    let mut speedups = vec![vec![Vec::new(); Mode::ALL.len()]; workloads.len()];
    // As in the paper (each copy as many threads as processors, two copies: demand twice the
    // processors), then 4x and 8x (4 and 8 vCPUs and N-body threads per copy).
    let ideal = pcpus as f64 / 2.0;
    for per_copy in [2u32, 4, 8] {
        let level = 2 * per_copy as usize / pcpus;
        println!(
            "\n  two copies x {per_copy} vCPUs ({per_copy} threads for N-body) on {pcpus} physical CPUs: {level}x overcommit"
        );
        println!(
            "  {:<46} {:>9} {:>12} {:>11} {:>8} {:>8} {:>12} {:>10}",
            "workload",
            "alone ms",
            "activations",
            "host-sched",
            "vs host",
            "ceiling",
            "time slicer",
            "vs slicer"
        );
        for (w, workload) in workloads.iter().enumerate() {
            let mut args: Vec<String> = workload.args.clone();
            if args[0] == "nbody" {
                args[3] = per_copy.to_string();
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let name = workload.name.replace("{threads}", &per_copy.to_string());
            let mut alone = Vec::new();
            let mut by_mode = vec![Vec::new(); Mode::ALL.len()];
            let measured = (0..rounds).try_for_each(|_| -> Result<(), String> {
                let base = ms_of(&run(&image, 1, 1, 1, Mode::Activations, &args)?)?[0];
                alone.push(base);
                for (m, &mode) in Mode::ALL.iter().enumerate() {
                    let ms = ms_of(&run(&image, 2, per_copy, pcpus, mode, &args)?)?;
                    by_mode[m].extend(ms.iter().map(|ms| base / ms));
                }
                Ok(())
            });
            if let Err(e) = measured {
                println!("  {name:<46} n/a: {e}");
                continue;
            }
            let [act, host, slicer] = [0, 1, 2].map(|m| summary(&mut by_mode[m]).0);
            for (m, speedup) in [act, host, slicer].into_iter().enumerate() {
                speedups[w][m].push((level as f64, speedup));
            }
            println!(
                "  {name:<46} {:>9.1} {act:>11.2}x {host:>10.2}x {:>7.2}x {:>7.2}x {slicer:>11.2}x {:>9.2}x",
                summary(&mut alone).0,
                act / host,
                ideal / host,
                act / slicer
            );
        }
    }
    println!(
        "\n  The ideal speedup of each copy is {}/2 = {:.1}x (the paper's: 6/2 = 3). ceiling = ideal /",
        pcpus, ideal
    );
    println!("  host-sched's speedup: the most any mode can gain over host-sched on that row.");
    for (w, workload) in workloads.iter().enumerate() {
        let stem = ["nbody", "locks-4", "locks-1"][w];
        let path = plot::out_dir().join(format!("overcommit-{stem}.svg"));
        let series: Vec<plot::Series> = Mode::ALL
            .iter()
            .zip(&speedups[w])
            .map(|(mode, points)| (mode.name().to_string(), points.clone()))
            .collect();
        let title = workload.name.replace("{threads}", "N");
        plot::report(
            plot::lines(
                &path,
                &title,
                ("overcommit (vCPUs / physical CPUs)", "speedup per copy"),
                &series,
                false,
            ),
            &path,
        );
    }
    upcall_latency(quick);
}

/// Upcall latency beside a raw kick, a raw interrupt and vCPU add/remove.
fn upcall_latency(quick: bool) {
    // Upcall latency: PREEMPTED, from the kick to the guest's handler, one sample per run.
    let selftest = guest("selftest");
    let runs = if quick { 5 } else { 30 };
    let mut upcall = Vec::new();
    let mut capture = Vec::new();
    for _ in 0..runs {
        let console = Captured::default();
        let config = VmConfig {
            vcpus: 2,
            args: vec!["sa".into()],
            ..VmConfig::new(&selftest)
        };
        let options = MonitorOptions {
            pcpus: 2,
            timeout: Some(Duration::from_secs(30)),
            place_vcpus: true,
            ..MonitorOptions::default()
        };
        match activm::run_guests(&[config], vec![Box::new(console.clone())], &options) {
            Ok(reports) if reports[0].outcome == Outcome::Exited(0) => {
                if let Some(us) = field(&console.text(), "latency_us") {
                    upcall.push(us);
                }
                // "preemption latency (kick to context in hand): median 16.1 us, ..."
                let stats = &reports[0].stats;
                if let Some(us) = stats
                    .find("median ")
                    .and_then(|at| field(&format!("m={}", &stats[at + 7..]), "m"))
                {
                    capture.push(us);
                }
            }
            Ok(reports) => println!("  selftest sa failed: {:?}", reports[0].outcome),
            Err(e) => println!("  selftest sa failed: {e}"),
        }
    }
    let mut kick = floor::kick_latency(if quick { 50 } else { 300 });
    let ipi = {
        let console = Captured::default();
        let config = VmConfig {
            vcpus: 2,
            args: vec!["ipi-latency".into()],
            ..VmConfig::new(&selftest)
        };
        let _ = activm::run(&config, Box::new(console.clone()));
        console.text()
    };
    // vCPU add/remove through the control socket: remove = PREEMPTED hand-off, add = NEWPROC.
    let socket = std::env::temp_dir().join(format!("activm-bench-{}.sock", std::process::id()));
    let (mut removes, mut adds) = (Vec::new(), Vec::new());
    {
        let seconds = if quick { "1" } else { "3" };
        let config = VmConfig {
            vcpus: 2,
            args: vec!["sa-spin".into(), seconds.into()],
            ..VmConfig::new(&selftest)
        };
        let options = MonitorOptions {
            pcpus: 2,
            timeout: Some(Duration::from_secs(60)),
            ctl_socket: Some(socket.clone()),
            place_vcpus: true,
            ..MonitorOptions::default()
        };
        let console = Captured::default();
        let guest_console = console.clone();
        let runner = std::thread::spawn(move || {
            activm::run_guests(&[config], vec![Box::new(guest_console)], &options)
        });
        let ready = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            console.text().contains("sa-spin: ready")
        });
        let set = |n: u64| {
            let answer = activm::ctl::request(
                &socket,
                &serde_json::json!({"op": "set-vcpus", "guest": 0, "vcpus": n}),
            );
            answer
                .ok()
                .and_then(|a| a.get("applied_us").and_then(serde_json::Value::as_f64))
        };
        if ready {
            for _ in 0..if quick { 5 } else { 60 } {
                removes.extend(set(1));
                std::thread::sleep(Duration::from_millis(5));
                adds.extend(set(2));
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // The guest exits by itself after a few seconds.
        let _ = runner.join();
    }

    println!("\nupcall latency (us)                                   median      p99     n");
    let row = |name: &str, samples: &mut Vec<f64>| {
        if samples.is_empty() {
            println!("  {name:<50} n/a");
        } else {
            let n = samples.len();
            samples.sort_by(|a, b| a.total_cmp(b));
            let p99 = samples[((n - 1) as f64 * 0.99).round() as usize];
            println!(
                "  {name:<50} {:>7.1} {:>8.1} {n:>5}",
                samples[(n - 1) / 2],
                p99
            );
        }
    };
    row("PREEMPTED: kick -> guest upcall handler", &mut upcall);
    row(
        "  of which kick -> context in the VMM's hands",
        &mut capture,
    );
    row("raw kick (bare VM at CPL3, signal -> EINTR)", &mut kick);
    row(
        "vCPU remove (ctl set-vcpus, until handed over)",
        &mut removes,
    );
    row("vCPU add (ctl set-vcpus, until running)", &mut adds);
    match (field(&ipi, "median"), field(&ipi, "p99")) {
        (Some(m), Some(p)) => println!(
            "  {:<50} {m:>7.1} {p:>8.1} {:>5}",
            "raw interrupt (CPL3 IPI -> CPL3 handler)", 200
        ),
        _ => println!("  {:<50} n/a", "raw interrupt (CPL3 IPI -> CPL3 handler)"),
    }
}
