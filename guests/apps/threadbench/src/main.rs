//! The activm guest side of the thread micro-benchmarks (`benches/benches/threads.rs`, issue 3):
//! the same operations, arguments and output as the host baselines (`benches/baselines/nptl.rs`
//! and `benches/baselines/go`), on the activm runtime (`activm_rt::thread`, `activm_rt::sync`),
//! timed with `rdtsc` and the TSC frequency from the boot info. The workloads themselves are
//! `benches/baselines/workloads.rs`, the very code the NPTL baseline runs.
//!
//! `activm run threadbench --vcpus N -- OP key=value ...`
//!   null-fork       trials= iters=             create + join a thread with an empty body
//!   signal-wait     trials= iters=             mutex+condvar ping-pong; iters round trips
//!   yield           trials= iters=             2 threads, iters yields each
//!   mutex           trials= iters=             uncontended lock+unlock
//!   mutex-contended trials= iters=             2 threads, iters acquisitions each
//!   create          trials= total= top= children=   NPTL paper: thread creation
//!   contention      trials= total= threads= regions= NPTL paper: lock contention (csfast)
//!
//! Output: `INFO ...` lines, then one line `BENCH OP v1 v2 ...`, one value per trial in
//! nanoseconds: per operation (per signal-wait = round trip / 2, per yield, per acquisition) for
//! the first five, the trial's total time for `create` and `contention`. One untimed warm-up
//! trial runs first (not for `create`, whose 100,000 creations warm up by themselves).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use activm_stub::{nr_vcpus, println, tsc_khz};

use workloads::{
    contention, create, mutex_contended, mutex_uncontended, null_fork, signal_wait, yield_pair,
};

activm_rt::main!(main);

fn main(args: &[&str]) -> i32 {
    let Some((&op, rest)) = args.split_first() else {
        return usage("missing OP");
    };
    let p = match Params::parse(rest) {
        Ok(p) => p,
        Err(why) => return usage(&why),
    };
    match run(op, &p) {
        Ok(()) => 0,
        Err(why) => usage(&why),
    }
}

fn usage(why: &str) -> i32 {
    println!("threadbench: {why}");
    println!("usage: threadbench OP [key=value ...]  (OP: null-fork signal-wait yield mutex mutex-contended create contention)");
    2
}

fn run(op: &str, p: &Params) -> Result<(), String> {
    let trials = p.get("trials")?;
    let bench: Box<dyn Fn() -> f64> = match op {
        "null-fork" => {
            let iters = p.get("iters")?;
            Box::new(move || null_fork(iters))
        }
        "signal-wait" => {
            let iters = p.get("iters")?;
            Box::new(move || signal_wait(iters))
        }
        "yield" => {
            let iters = p.get("iters")?;
            Box::new(move || yield_pair(iters))
        }
        "mutex" => {
            let iters = p.get("iters")?;
            Box::new(move || mutex_uncontended(iters))
        }
        "mutex-contended" => {
            let iters = p.get("iters")?;
            Box::new(move || mutex_contended(iters))
        }
        "create" => {
            let (total, top, children) = (p.get("total")?, p.get("top")?, p.get("children")?);
            Box::new(move || create(total, top, children))
        }
        "contention" => {
            let (total, threads, regions) = (p.get("total")?, p.get("threads")?, p.get("regions")?);
            Box::new(move || contention(total, threads, regions))
        }
        other => return Err(alloc::format!("unknown OP {other:?}")),
    };
    println!("INFO vcpus={} tsc_khz={}", nr_vcpus(), tsc_khz());
    if op != "create" {
        bench(); // warm-up: stacks and runtime structures allocated, pages touched
    }
    let mut line = String::from("BENCH ");
    line.push_str(op);
    for _ in 0..trials {
        let _ = write!(line, " {:.1}", bench());
    }
    println!("{line}");
    Ok(())
}

/// `key=value` arguments.
#[derive(Debug)]
struct Params(Vec<(String, u64)>);

impl Params {
    fn parse(args: &[&str]) -> Result<Params, String> {
        let mut out = Vec::new();
        for a in args {
            let (k, v) = a
                .split_once('=')
                .ok_or_else(|| alloc::format!("bad argument {a:?}"))?;
            let v = v
                .parse()
                .map_err(|_| alloc::format!("bad number in {a:?}"))?;
            out.push((String::from(k), v));
        }
        Ok(Params(out))
    }

    fn get(&self, key: &str) -> Result<u64, String> {
        match self.0.iter().find(|(k, _)| k == key) {
            Some(&(_, v)) if v > 0 => Ok(v),
            _ => Err(alloc::format!("missing or zero {key}=")),
        }
    }
}

/// What the shared workloads run on here: activm_rt's threads and locks, the TSC as the clock.
mod platform {
    pub use activm_rt::sync::{Condvar, Mutex};
    pub use activm_rt::thread;
    pub use alloc::collections::VecDeque;
    pub use alloc::sync::Arc;
    pub use alloc::vec::Vec;
    pub use core::hint::black_box;

    use activm_stub::{rdtsc, tsc_khz};

    /// A time stamp: the TSC.
    pub fn now() -> u64 {
        rdtsc()
    }

    /// Nanoseconds since TSC value `t0`.
    pub fn ns_since(t0: u64) -> f64 {
        (rdtsc() - t0) as f64 * 1e6 / tsc_khz() as f64
    }
}

#[path = "../../../../benches/baselines/workloads.rs"]
mod workloads;
