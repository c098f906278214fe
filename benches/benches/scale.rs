//! Scale (issue 13, item 6): N threads spawned, all live at once, then joined (`nbody spawn N`),
//! for N = 10^3 .. 10^6 on 2 vCPUs; then a fixed N on 1 .. 64 vCPUs per guest, with
//! activations on 2 processors beside the same guest host-scheduled (`--host-sched`, every
//! vCPU a host thread left to Linux). Reports the guest's own time (TSC) and the host CPU time
//! the run took (user + system, every thread of the VMM), whose ratio to the wall time says how
//! much of the machine the run really had: these machines are shared.
//!
//! The VMM's threads are pinned to 2 host CPUs (host-scheduled vCPUs included).
//!
//! `cargo xtask bench scale`; `ACTIVM_BENCH_QUICK=1` for a short smoke run.

use std::time::Duration;

use activm::{MonitorOptions, Outcome, VmConfig};
use activm_benches::modes::{pin_and_report, Mode};
use activm_benches::{field, guest_path, stats::summary, Captured};

/// CPU time (user + system) of this process so far, in ms.
fn cpu_ms() -> f64 {
    // SAFETY: getrusage writes only into the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}

/// One run of `nbody spawn threads`: (guest ms, host CPU ms), or why it failed.
fn run(
    image: &std::path::Path,
    threads: usize,
    vcpus: u32,
    mode: Mode,
) -> Result<(f64, f64), String> {
    let config = VmConfig {
        vcpus,
        mem_size: 3 << 30,
        args: vec!["spawn".into(), threads.to_string()],
        ..VmConfig::new(image)
    };
    let console = Captured::default();
    let options = MonitorOptions {
        timeout: Some(Duration::from_secs(300)),
        ..mode.options(2)
    };
    let cpu_before = cpu_ms();
    let reports = activm::run_guests(&[config], vec![Box::new(console.clone())], &options)
        .map_err(|e| e.to_string())?;
    let cpu = cpu_ms() - cpu_before;
    let text = console.text();
    if reports[0].outcome != Outcome::Exited(0) {
        return Err(format!(
            "{:?}: {}",
            reports[0].outcome,
            text.lines().last().unwrap_or("")
        ));
    }
    let ms = field(&text, "ms").ok_or_else(|| format!("no RESULT line in {text:?}"))?;
    Ok((ms, cpu))
}

/// Of `rounds` runs: (median guest ms, best guest ms, median host CPU ms). The best run is the
/// one the host disturbed least.
fn medians(
    image: &std::path::Path,
    rounds: usize,
    threads: usize,
    vcpus: u32,
    mode: Mode,
) -> Result<(f64, f64, f64), String> {
    let (mut ms, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (m, c) = run(image, threads, vcpus, mode)?;
        ms.push(m);
        cpu.push(c);
    }
    let median = summary(&mut ms).0;
    // `summary` sorted the samples: the first is the best.
    Ok((median, ms[0], summary(&mut cpu).0))
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let rounds = if quick { 1 } else { 3 };
    let Some(image) = guest_path("nbody") else {
        println!("scale: n/a (guest `nbody` is not built: cargo xtask build-guests --release)");
        return;
    };
    pin_and_report(2);
    println!("Scale: N threads spawned (all live at once), then joined; medians of {rounds} runs");
    println!(
        "host CPU = user + system time of the whole VMM for the run (boot included); guest ms is"
    );
    println!(
        "wall time inside the guest, so on a loaded host it is well above the host CPU time\n"
    );
    println!(
        "  {:>9} {:>11} {:>13} {:>9} {:>10} {:>13} {:>9} {:>13} {:>15}",
        "threads",
        "guest ms",
        "ns/thread",
        "x 10^3",
        "best ms",
        "best ns/thr",
        "x 10^3",
        "host CPU ms",
        "CPU ns/thread"
    );
    let counts: &[usize] = if quick {
        &[1_000, 100_000]
    } else {
        &[1_000, 10_000, 100_000, 1_000_000]
    };
    let (mut base, mut best_base) = (None, None);
    for &n in counts {
        match medians(&image, rounds, n, 2, Mode::Activations) {
            Ok((ms, best, cpu)) => {
                let per = ms * 1e6 / n as f64;
                let best_per = best * 1e6 / n as f64;
                let base = *base.get_or_insert(per);
                let best_base = *best_base.get_or_insert(best_per);
                println!(
                    "  {n:>9} {ms:>11.1} {per:>13.0} {:>8.2}x {best:>10.1} {best_per:>13.0} {:>8.2}x {cpu:>13.0} {:>15.0}",
                    per / base,
                    best_per / best_base,
                    cpu * 1e6 / n as f64
                );
            }
            Err(e) => println!("  {n:>9} n/a: {e}"),
        }
    }

    let n = if quick { 10_000 } else { 100_000 };
    println!("\n  {n} threads on V vCPUs: activations on 2 processors vs host-scheduled");
    println!(
        "  {:>5} {:>15} {:>15} {:>15} {:>15} {:>8}",
        "vCPUs", "act guest ms", "act host CPU", "host guest ms", "host host CPU", "ratio"
    );
    let vcpus: &[u32] = if quick {
        &[1, 8, 64]
    } else {
        &[1, 2, 4, 8, 16, 32, 64]
    };
    for &v in vcpus {
        match (
            medians(&image, rounds, n, v, Mode::Activations),
            medians(&image, rounds, n, v, Mode::HostSched),
        ) {
            (Ok((am, _, ac)), Ok((hm, _, hc))) => println!(
                "  {v:>5} {am:>15.1} {ac:>15.0} {hm:>15.1} {hc:>15.0} {:>7.2}x",
                hm / am
            ),
            (Err(e), _) | (_, Err(e)) => println!("  {v:>5} n/a: {e}"),
        }
    }
    println!("\n  ratio = host-scheduled guest time / activations guest time (above 1: activations faster)");
}
