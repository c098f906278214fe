//! activm-rt's in-guest test suite.
//!
//! `activm run rt-tests --vcpus N -- [TEST...]` runs every test (or those named; a name ending
//! in `*` is a prefix), one line each, then `N passed, M failed`; exits 0 only if all passed
//! (2 if a name matches no test).
//! Modes that end the guest: `overflow` (a thread runs off its stack: the guard page catches
//! it), `panic` (a named thread panics), `fault bad-access|undefined` (a named thread reads the
//! null page or runs an undefined instruction). `bench` prints timings. `list` lists the tests.
//! `chaos-soak SECONDS`: mutex and spinlock counters, condvar ping-pong, sleeps, spawns,
//! messages (and disk I/O with `--disk`) for that long, meant to run under `activm run --chaos`
//! (processors revoked and granted every 0.1-2 ms); every invariant is checked at the end.
//! `blk-durable`, `blk-fill` and `blk-vanish` serve the host's durability and fault tests
//! (`faults.rs`).
//!
//! The `upcall-*` tests use the runtime's simulated VMM, which needs the VMM's own activations
//! off (`activm run --no-activations`); with activations on they are skipped, and `sa-real`
//! and `sa-chaos` (allocation changes every 0.1-2 ms under the stress workload) exercise the
//! real ones instead. The `blk*` tests need a disk (`--disk IMAGE`, at least 1 MiB); with
//! `--io-latency` the device is slow and `blk-overlap` checks that threads keep computing
//! while others wait for it (with activations: BLOCKED / UNBLOCKED upcalls).
#![no_std]
#![no_main]

extern crate alloc;

mod bench;
mod faults;
mod handover;
mod regs;
mod std_cases;
mod std_native;
mod tests;

/// What `std_cases` runs against here (on the host, the same names come from std).
mod api {
    pub use activm_rt::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub use activm_rt::sync::{mpsc, Arc, Condvar, LazyLock, Mutex, Once, OnceLock};
    pub use activm_rt::sync::{PoisonError, RwLock, RwLockWriteGuard};
    pub use activm_rt::thread;
    pub use activm_rt::time::{Duration, Instant};
    pub use alloc::format;
    pub use alloc::string::String;
    pub use alloc::vec::Vec;
}

/// Every test: the suite's own, then the differential std cases.
fn all_tests() -> impl Iterator<Item = (&'static str, Needs, tests::TestFn)> {
    let cases = std_cases::CASES
        .iter()
        .map(|&(name, f)| (name, Needs::Any, f as tests::TestFn));
    tests::ALL.iter().copied().chain(cases)
}

use activm_rt::println;

/// A test: `Ok(detail)` or `Err(reason)`; `Err("skipped: why")` when it cannot run here.
pub type TestResult = Result<alloc::string::String, alloc::string::String>;

/// What a test needs to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Any,
    /// The simulated VMM (activations off).
    Sim,
    /// The VMM's activations.
    Activations,
    /// A block device (`activm run --disk IMAGE`).
    Disk,
}

/// Whether test `name` is one `selected` names (a name ending in `*` is a prefix).
fn names(selected: &str, name: &str) -> bool {
    match selected.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => selected == name,
    }
}

fn run_selected(selected: &[&str]) -> i32 {
    // A name that matches no test is a usage error, not a test that silently did not run.
    let unknown: alloc::vec::Vec<&str> = selected
        .iter()
        .copied()
        .filter(|s| !all_tests().any(|(name, _, _)| names(s, name)))
        .collect();
    if !unknown.is_empty() {
        println!(
            "rt-tests: no test named {} (`rt-tests list` lists them)",
            unknown.join(", ")
        );
        return 2;
    }
    let mut passed = 0;
    let mut failed = 0;
    for (name, needs, f) in all_tests() {
        let named = selected.iter().any(|s| names(s, name));
        if !(selected.is_empty() || named) {
            continue;
        }
        let sa = activm_rt::upcall::activations_enabled();
        let skip = match needs {
            Needs::Any => None,
            Needs::Sim if sa => {
                Some("needs the VMM's activations off: activm run --no-activations")
            }
            Needs::Activations if !sa => Some("needs the VMM's activations on"),
            Needs::Activations if activm_rt::rt::nr_vcpus() < 2 => Some("needs 2 vCPUs or more"),
            Needs::Disk if activm_rt::blk::capacity() == 0 => {
                Some("needs a disk: activm run --disk IMAGE")
            }
            _ => None,
        };
        if let Some(why) = skip {
            println!("test {name} ... skipped ({why})");
            continue;
        }
        let start = activm_rt::rt::rdtsc();
        let result = f();
        let ms = activm_rt::rt::ticks_to_ns(activm_rt::rt::rdtsc() - start) / 1_000_000;
        match result {
            Ok(detail) => {
                passed += 1;
                println!("test {name} ... ok ({detail}; {ms} ms)");
            }
            Err(why) => match why.strip_prefix("skipped: ") {
                Some(why) => println!("test {name} ... skipped ({why})"),
                None => {
                    failed += 1;
                    println!("test {name} ... FAILED: {why}");
                }
            },
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 {
        0
    } else {
        1
    }
}

fn main(args: &[&str]) -> i32 {
    match args.first().copied() {
        Some("overflow") => tests::overflow_mode(),
        Some("panic") => tests::panic_mode(),
        Some("deadlock") => tests::deadlock_mode(),
        Some("watchdog-lost-report") => tests::watchdog_lost_report_mode(),
        Some("fault") => tests::fault_mode(args.get(1).copied().unwrap_or("")),
        Some("fault-handover") => handover::fault_handover(),
        Some("bench") => bench::run(&args[1..]),
        Some("chaos-soak") => {
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
            match tests::chaos_soak(secs) {
                Ok(detail) => {
                    println!("chaos-soak: ok ({detail})");
                    0
                }
                Err(why) => {
                    println!("chaos-soak: FAILED: {why}");
                    1
                }
            }
        }
        Some("blk-durable") => faults::durable(&args[1..]),
        Some("blk-fill") => faults::fill(),
        Some("blk-vanish") => faults::vanish(),
        Some("list") => {
            for (name, _, _) in all_tests() {
                println!("{name}");
            }
            0
        }
        _ => run_selected(args),
    }
}

activm_rt::main!(main);
