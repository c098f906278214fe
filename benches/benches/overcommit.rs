//! vCPU overcommit (Anderson et al. 1992, Table V): two copies of a parallel application run at once on
//! fewer physical CPUs than they have vCPUs, with scheduler activations and in oblivious mode
//! (`--no-activations`), reporting each copy's speedup over the same application alone on one
//! vCPU. Then the upcall latency beside the raw cost of a kick and of an interrupt.
//!
//! `cargo xtask bench overcommit`; `ACTIVM_BENCH_QUICK=1` for a short smoke run.

use std::time::Duration;

use activm::{MonitorOptions, Outcome, VmConfig};
use activm_benches::{field, floor, guest, stats::summary, Captured};

/// Run `copies` copies of `image` with `guest_args` on `pcpus` physical CPUs; returns what each
/// copy printed, or why it failed.
fn run(
    image: &std::path::Path,
    copies: usize,
    vcpus: u32,
    pcpus: usize,
    activations: bool,
    guest_args: &[&str],
) -> Result<Vec<String>, String> {
    let config = VmConfig {
        vcpus,
        mem_size: 256 << 20,
        args: guest_args.iter().map(|s| s.to_string()).collect(),
        ..VmConfig::new(image)
    };
    let configs = vec![config; copies];
    let consoles: Vec<Captured> = (0..copies).map(|_| Captured::default()).collect();
    let boxed = consoles
        .iter()
        .map(|c| Box::new(c.clone()) as Box<dyn std::io::Write + Send>)
        .collect();
    let options = MonitorOptions {
        pcpus,
        activations,
        timeout: Some(Duration::from_secs(300)),
        ..MonitorOptions::default()
    };
    let reports = activm::run_guests(&configs, boxed, &options).map_err(|e| e.to_string())?;
    for (report, console) in reports.iter().zip(&consoles) {
        if report.outcome != Outcome::Exited(0) {
            return Err(format!(
                "{:?}: {}",
                report.outcome,
                console.text().lines().last().unwrap_or("")
            ));
        }
    }
    Ok(consoles.iter().map(Captured::text).collect())
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
    let vcpus = 2;
    println!(
        "vCPU overcommit, multiprogramming level 2: two copies of an app on {pcpus} physical CPUs"
    );
    println!("(Anderson et al. 1992, Table V: 6 processors, FastThreads on Topaz 1.29, original FastThreads 1.26, new FastThreads 2.45)");
    println!("speedup = time of one copy alone on 1 vCPU / time of each copy under multiprogramming; medians of {rounds} rounds");
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
    let nbody = activm_benches::guest_path("nbody");
    match &nbody {
        None => println!("\n  Table V rows: n/a (guest `nbody` is not built: it needs the guest runtime, guests/apps/nbody)"),
        Some(image) => {
            // As in the seed (each copy as many threads as processors, two copies: demand twice
            // the processors), then twice that overcommit (4 vCPUs and threads per copy).
            for per_copy in [vcpus, 2 * vcpus] {
                println!(
                    "\n  two copies x {per_copy} vCPUs ({per_copy} threads for N-body) on {pcpus} physical CPUs: {}x overcommit",
                    2 * per_copy as usize / pcpus
                );
                println!("  {:<46} {:>10} {:>14} {:>14} {:>8}", "workload", "alone ms", "activations", "oblivious", "ratio");
                for w in &workloads {
                    let mut args: Vec<String> = w.args.clone();
                    if args[0] == "nbody" {
                        args[3] = per_copy.to_string();
                    }
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let name = w.name.replace("{threads}", &per_copy.to_string());
                    let mut alone = Vec::new();
                    let mut act = Vec::new();
                    let mut obl = Vec::new();
                    let mut failure = None;
                    for _ in 0..rounds {
                        match (|| -> Result<(), String> {
                            let base = ms_of(&run(image, 1, 1, 1, true, &args)?)?[0];
                            alone.push(base);
                            act.extend(ms_of(&run(image, 2, per_copy, pcpus, true, &args)?)?.iter().map(|ms| base / ms));
                            obl.extend(ms_of(&run(image, 2, per_copy, pcpus, false, &args)?)?.iter().map(|ms| base / ms));
                            Ok(())
                        })() {
                            Ok(()) => {}
                            Err(e) => {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                    match failure {
                        Some(e) => println!("  {name:<46} n/a: {e}"),
                        None => {
                            let (a, _, _) = summary(&mut act);
                            let (o, _, _) = summary(&mut obl);
                            println!("  {name:<46} {:>10.1} {:>13.2}x {:>13.2}x {:>7.2}x", summary(&mut alone).0, a, o, a / o);
                        }
                    }
                }
            }
            println!("\n  The ideal speedup of each copy is {}/2 = {:.1}x (the seed's: 6/2 = 3). Oblivious guests' idle vCPUs", pcpus, pcpus as f64 / 2.0);
            println!("  halt holding their processor until the end of their quantum, as the seed's original FastThreads'");
            println!("  virtual processors spun; a host that ran another vCPU whenever one halts would do better.");
        }
    }

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
