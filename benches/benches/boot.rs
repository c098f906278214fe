//! Boot time: activm (start → first guest instruction → guest main) beside the platform floor
//! (a bare VM with the same memory run to its first exit), measured alternately in one run.
//!
//! `cargo bench -p activm-benches --bench boot [-- ROUNDS]`

use std::time::Duration;

use activm::VmConfig;
use activm_benches::{floor, guest, stats::summary};

const MEM: u64 = 256 << 20;

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let demo = guest("demo");
    let tsc_khz = tsc_khz();
    let us = |ticks: u64| ticks as f64 * 1000.0 / tsc_khz;
    let (mut floor_us, mut first_us, mut main_us, mut total_us) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let start = activm::rdtsc();
        let exit = floor::boot_to_first_exit(MEM as usize);
        floor_us.push(us(exit - start));

        let start = activm::rdtsc();
        let config = VmConfig {
            mem_size: MEM,
            boot_timing: true,
            timeout: Some(Duration::from_secs(30)),
            start_tsc: start,
            ..VmConfig::new(&demo)
        };
        let report = activm::run(&config, Box::new(std::io::sink())).expect("activm run");
        let end = activm::rdtsc();
        assert_eq!(
            report.outcome,
            activm::Outcome::Exited(0),
            "demo guest failed"
        );
        let timing = report.timing.expect("boot timing");
        let (first, main) = timing.vcpus[0];
        first_us.push(us(first - start));
        main_us.push(us(main - start));
        total_us.push(us(end - start));
    }
    let (floor_med, floor_p10, floor_p90) = summary(&mut floor_us);
    println!(
        "boot time, {rounds} rounds, 1 vCPU, {} MiB (medians, p10..p90):",
        MEM >> 20
    );
    println!(
        "  {:<42} {:>9.1} us  ({:.1}..{:.1})   1.00x",
        "floor: bare VM to its first exit", floor_med, floor_p10, floor_p90
    );
    for (name, samples) in [
        ("activm: start -> first guest instruction", &mut first_us),
        ("activm: start -> guest main (CPL3)", &mut main_us),
        ("activm: start -> guest exit, VM torn down", &mut total_us),
    ] {
        let (med, p10, p90) = summary(samples);
        println!(
            "  {name:<42} {med:>9.1} us  ({p10:.1}..{p90:.1})  {:5.2}x",
            med / floor_med
        );
    }
}

/// The TSC frequency, measured against the monotonic clock over 50 ms.
fn tsc_khz() -> f64 {
    let t0 = std::time::Instant::now();
    let c0 = activm::rdtsc();
    std::thread::sleep(Duration::from_millis(50));
    let c1 = activm::rdtsc();
    (c1 - c0) as f64 / t0.elapsed().as_secs_f64() / 1000.0
}
