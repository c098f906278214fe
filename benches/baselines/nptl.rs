//! Thread micro-benchmarks on host Linux threads: `std::thread` is NPTL's pthreads, and std's
//! `Mutex`/`Condvar` are futex-based, so this is NPTL with futex locks.
//!
//! The same operations, arguments and output as the Go baseline (`baselines/go`) and the activm
//! guest (`guests/apps/threadbench`); `benches/benches/threads.rs` runs all three. The workloads
//! themselves are `workloads.rs`, shared with that guest.
//!
//! usage: threadbench-nptl OP [key=value ...]
//!   null-fork       trials= iters=             create + join a thread with an empty body
//!   signal-wait     trials= iters=             mutex+condvar ping-pong; iters round trips
//!   yield           trials= iters=             2 threads pinned to one CPU, iters yields each
//!   mutex           trials= iters=             uncontended lock+unlock
//!   mutex-contended trials= iters=             2 threads, iters acquisitions each
//!   create          trials= total= top= children=   NPTL paper: thread creation
//!   contention      trials= total= threads= regions= NPTL paper: lock contention (csfast)
//!
//! Output: one line `BENCH OP v1 v2 ...`, one value per trial in nanoseconds: per operation
//! (per signal-wait = round trip / 2, per yield, per acquisition) for the first five, the
//! trial's total time for `create` and `contention`. One untimed warm-up trial runs first
//! (not for `create`, whose 100,000 creations warm up by themselves).

use workloads::{
    contention, create, mutex_contended, mutex_uncontended, null_fork, signal_wait, yield_pair,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((op, rest)) = args.split_first() else {
        usage("missing OP");
    };
    let p = Params::parse(rest);
    let trials = p.get("trials");
    let run: Box<dyn Fn() -> f64> = match op.as_str() {
        "null-fork" => {
            let iters = p.get("iters");
            Box::new(move || null_fork(iters))
        }
        "signal-wait" => {
            let iters = p.get("iters");
            Box::new(move || signal_wait(iters))
        }
        "yield" => {
            let iters = p.get("iters");
            pin_to_cpu0();
            Box::new(move || yield_pair(iters))
        }
        "mutex" => {
            let iters = p.get("iters");
            Box::new(move || mutex_uncontended(iters))
        }
        "mutex-contended" => {
            let iters = p.get("iters");
            Box::new(move || mutex_contended(iters))
        }
        "create" => {
            let (total, top, children) = (p.get("total"), p.get("top"), p.get("children"));
            Box::new(move || create(total, top, children))
        }
        "contention" => {
            let (total, threads, regions) = (p.get("total"), p.get("threads"), p.get("regions"));
            Box::new(move || contention(total, threads, regions))
        }
        other => usage(&format!("unknown OP {other:?}")),
    };
    if op != "create" {
        run(); // warm-up: thread stacks cached, pages touched (create warms up by itself)
    }
    let samples: Vec<String> = (0..trials).map(|_| format!("{:.1}", run())).collect();
    println!("BENCH {op} {}", samples.join(" "));
}

fn usage(why: &str) -> ! {
    eprintln!("threadbench-nptl: {why}\nusage: threadbench-nptl OP [key=value ...] (see the source header)");
    std::process::exit(2)
}

/// `key=value` arguments.
#[derive(Debug)]
struct Params(Vec<(String, u64)>);

impl Params {
    fn parse(args: &[String]) -> Params {
        Params(
            args.iter()
                .map(|a| {
                    let (k, v) = a
                        .split_once('=')
                        .unwrap_or_else(|| usage(&format!("bad argument {a:?}")));
                    let v = v
                        .parse()
                        .unwrap_or_else(|_| usage(&format!("bad number in {a:?}")));
                    (k.to_string(), v)
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> u64 {
        match self.0.iter().find(|(k, _)| k == key) {
            Some(&(_, v)) if v > 0 => v,
            _ => usage(&format!("missing or zero {key}=")),
        }
    }
}

/// What the shared workloads run on here: std's threads and locks (NPTL and futexes on Linux),
/// `Instant` as the clock.
mod platform {
    pub use std::collections::VecDeque;
    pub use std::hint::black_box;
    pub use std::sync::{Arc, Condvar, Mutex};
    pub use std::thread;
    pub use std::time::Instant;
    pub use std::vec::Vec;

    /// A time stamp.
    pub fn now() -> Instant {
        Instant::now()
    }

    /// Nanoseconds since `t0`.
    pub fn ns_since(t0: Instant) -> f64 {
        t0.elapsed().as_nanos() as f64
    }
}

mod workloads;

/// Built as an activm std guest (`guests/apps/std-threadbench`): nothing to pin, the benchmark
/// boots it on one vCPU.
#[cfg(not(target_os = "linux"))]
fn pin_to_cpu0() {}

/// Restrict this thread (and the threads it creates later) to CPU 0.
#[cfg(target_os = "linux")]
fn pin_to_cpu0() {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it; sched_setaffinity
    // reads `size_of::<cpu_set_t>()` bytes from it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}
