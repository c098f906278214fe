//! Scale (issue 13, item 6): N threads spawned, all live at once, then joined (`nbody spawn N 2`),
//! for N = 10^3 .. 10^6 on 2 vCPUs, twice in the same guest: the first round ("cold") touches
//! its memory for the first time, the second ("warm") reuses it, so the two separate the
//! runtime's own cost from the host's first-touch cost. Beside them, the same number of bytes
//! of fresh host memory first touched by this process (huge pages advised, as the VMM does for
//! guest RAM): the floor a first round cannot go below. Then a fixed N on 1 .. 64 vCPUs, with
//! activations on 2 processors beside the same guest host-scheduled (`--host-sched`, every
//! vCPU a host thread left to Linux). Reports the guest's own time (TSC) and the host CPU time
//! the run took (user + system, every thread of the VMM), whose ratio to the wall time says how
//! much of the machine the run really had: these machines are shared. A second table runs the
//! first round with guest RAM faulted in before boot (`--prefault`, `VmConfig::prefault`)
//! beside the same round without, with each whole run's wall time: what prefaulting moves to
//! boot.
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

/// Milliseconds to first-touch `bytes` of fresh anonymous memory (one write per 4 KiB page),
/// advised for transparent huge pages like guest RAM (`vmm/src/memory.rs`).
fn host_first_touch_ms(bytes: usize) -> Option<f64> {
    let len = bytes.next_multiple_of(2 << 20).max(2 << 20);
    // SAFETY: a fresh private anonymous mapping; checked for failure below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: `p..p+len` is the mapping just made; advice only.
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    let start = std::time::Instant::now();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the mapping, which is read-write.
        unsafe { std::ptr::write_volatile((p as *mut u8).add(off), 1) };
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    // SAFETY: unmaps exactly the mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(p, len) };
    Some(ms)
}

/// Guest RAM of every run.
const MEM: u64 = 3 << 30;

/// One run's numbers.
#[derive(Clone, Copy)]
struct Run {
    /// First round (memory touched for the first time), guest ms.
    cold_ms: f64,
    /// Best later round in the same guest, guest ms (NaN when only one round ran).
    warm_ms: f64,
    /// Guest heap bytes in use per live thread.
    heap_per_thread: f64,
    /// Host CPU time of the whole run (boot and every round), ms.
    cpu_ms: f64,
    /// Wall time of the whole run (boot, every round, exit), ms.
    wall_ms: f64,
}

/// One run of `nbody spawn threads rounds`, or why it failed.
fn run(
    image: &std::path::Path,
    threads: usize,
    rounds: usize,
    vcpus: u32,
    mode: Mode,
    prefault: bool,
) -> Result<Run, String> {
    let config = VmConfig {
        vcpus,
        mem_size: MEM,
        prefault,
        args: vec!["spawn".into(), threads.to_string(), rounds.to_string()],
        ..VmConfig::new(image)
    };
    let console = Captured::default();
    let options = MonitorOptions {
        timeout: Some(Duration::from_secs(300)),
        ..mode.options(2)
    };
    let cpu_before = cpu_ms();
    let started = std::time::Instant::now();
    let reports = activm::run_guests(&[config], vec![Box::new(console.clone())], &options)
        .map_err(|e| e.to_string())?;
    let cpu = cpu_ms() - cpu_before;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    let text = console.text();
    if reports[0].outcome != Outcome::Exited(0) {
        return Err(format!(
            "{:?}: {}",
            reports[0].outcome,
            text.lines().last().unwrap_or("")
        ));
    }
    let cold_ms = field(&text, "ms").ok_or_else(|| format!("no RESULT line in {text:?}"))?;
    Ok(Run {
        cold_ms,
        warm_ms: field(&text, "warm_ms").unwrap_or(f64::NAN),
        heap_per_thread: field(&text, "heap_per_thread").unwrap_or(f64::NAN),
        cpu_ms: cpu,
        wall_ms,
    })
}

/// The medians of `runs` runs (each field on its own).
fn medians(
    image: &std::path::Path,
    runs: usize,
    threads: usize,
    rounds: usize,
    vcpus: u32,
    mode: Mode,
    prefault: bool,
) -> Result<Run, String> {
    let mut all = Vec::new();
    for _ in 0..runs {
        all.push(run(image, threads, rounds, vcpus, mode, prefault)?);
    }
    let median = |f: fn(&Run) -> f64| summary(&mut all.iter().map(f).collect::<Vec<_>>()).0;
    Ok(Run {
        cold_ms: median(|r| r.cold_ms),
        warm_ms: median(|r| r.warm_ms),
        heap_per_thread: median(|r| r.heap_per_thread),
        cpu_ms: median(|r| r.cpu_ms),
        wall_ms: median(|r| r.wall_ms),
    })
}

fn main() {
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let runs = if quick { 1 } else { 3 };
    let Some(image) = guest_path("nbody") else {
        println!("scale: n/a (guest `nbody` is not built: cargo xtask build-guests --release)");
        return;
    };
    pin_and_report(2);
    println!(
        "Scale: N threads spawned (all live at once), then joined, twice in one guest on 2 vCPUs;"
    );
    println!(
        "medians of {runs} runs. cold = the first round (its memory touched for the first time),"
    );
    println!("warm = the second (memory the first one used); host first touch = the same bytes of");
    println!("fresh host memory written once per 4 KiB by this process right after the runs\n");
    println!(
        "  {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7} {:>8} {:>11} {:>9}",
        "threads",
        "cold ms",
        "ns/thr",
        "x 10^3",
        "warm ms",
        "ns/thr",
        "x 10^3",
        "heap B/t",
        "host touch",
        "host CPU"
    );
    println!(
        "  {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7} {:>8} {:>11} {:>9}",
        "", "", "", "", "", "", "", "", "ns/thr", "ms"
    );
    let counts: &[usize] = if quick {
        &[1_000, 100_000]
    } else {
        &[1_000, 10_000, 100_000, 1_000_000]
    };
    let (mut cold_base, mut warm_base) = (None, None);
    let (mut prefault_rows, mut prefault_base) = (Vec::new(), None);
    for &n in counts {
        prefault_rows.push(prefault_row(&image, runs, n, &mut prefault_base));
        match medians(&image, runs, n, 2, 2, Mode::Activations, false) {
            Ok(r) => {
                let per = |ms: f64| ms * 1e6 / n as f64;
                let (cold, warm) = (per(r.cold_ms), per(r.warm_ms));
                let cold_base = *cold_base.get_or_insert(cold);
                let warm_base = *warm_base.get_or_insert(warm);
                let touch = host_first_touch_ms((r.heap_per_thread * n as f64) as usize)
                    .map_or("n/a".to_string(), |ms| format!("{:.0}", per(ms)));
                println!(
                    "  {n:>9} {:>9.1} {cold:>9.0} {:>6.2}x {:>9.1} {warm:>9.0} {:>6.2}x {:>8.0} {touch:>11} {:>9.0}",
                    r.cold_ms,
                    cold / cold_base,
                    r.warm_ms,
                    warm / warm_base,
                    r.heap_per_thread,
                    r.cpu_ms
                );
            }
            Err(e) => println!("  {n:>9} n/a: {e}"),
        }
    }
    print_prefault(&prefault_rows);

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
            medians(&image, runs, n, 1, v, Mode::Activations, false),
            medians(&image, runs, n, 1, v, Mode::HostSched, false),
        ) {
            (Ok(a), Ok(h)) => println!(
                "  {v:>5} {:>15.1} {:>15.0} {:>15.1} {:>15.0} {:>7.2}x",
                a.cold_ms,
                a.cpu_ms,
                h.cold_ms,
                h.cpu_ms,
                h.cold_ms / a.cold_ms
            ),
            (Err(e), _) | (_, Err(e)) => println!("  {v:>5} n/a: {e}"),
        }
    }
    println!("\n  ratio = host-scheduled guest time / activations guest time (above 1: activations faster)");
}

/// The same first round with all of guest RAM faulted in before boot (`--prefault`), and the
/// wall time of a whole run with and without it (what the prefault costs at boot).
fn prefault_row(image: &std::path::Path, runs: usize, n: usize, base: &mut Option<f64>) -> String {
    let per = |ms: f64| ms * 1e6 / n as f64;
    match (
        medians(image, runs, n, 1, 2, Mode::Activations, true),
        medians(image, runs, n, 1, 2, Mode::Activations, false),
    ) {
        (Ok(pre), Ok(plain)) => {
            let cold = per(pre.cold_ms);
            let base = *base.get_or_insert(cold);
            format!(
                "  {n:>9} {:>9.1} {cold:>9.0} {:>6.2}x {:>11.0} {:>11.0} {:>11.0}",
                pre.cold_ms,
                cold / base,
                per(plain.cold_ms),
                pre.wall_ms,
                plain.wall_ms
            )
        }
        (Err(e), _) | (_, Err(e)) => format!("  {n:>9} n/a: {e}"),
    }
}

fn print_prefault(rows: &[String]) {
    println!(
        "\n  With --prefault ({} GiB of guest RAM faulted in before boot), one round each, the",
        MEM >> 30
    );
    println!("  same round without it beside; run ms = the whole run's wall time (boot included)");
    println!(
        "  {:>9} {:>9} {:>9} {:>7} {:>11} {:>11} {:>11}",
        "threads", "cold ms", "ns/thr", "x 10^3", "plain ns/t", "run ms", "plain run"
    );
    for row in rows {
        println!("{row}");
    }
}
