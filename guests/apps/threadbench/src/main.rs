//! The activm guest side of the thread micro-benchmarks (`benches/benches/threads.rs`, issue 3):
//! the same operations, arguments and output as the host baselines (`benches/baselines/nptl.rs`
//! and `benches/baselines/go`), on the activm runtime (`activm_rt::thread`, `activm_rt::sync`),
//! timed with `rdtsc` and the TSC frequency from the boot info.
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
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt::Write;
use core::hint::black_box;

use activm_rt::sync::{Condvar, Mutex};
use activm_rt::thread;
use activm_stub::{nr_vcpus, println, rdtsc, tsc_khz};

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

/// Nanoseconds since TSC value `t0`.
fn ns_since(t0: u64) -> f64 {
    (rdtsc() - t0) as f64 * 1e6 / tsc_khz() as f64
}

/// A start gate: threads wait until the timer has started.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

fn null_fork(iters: u64) -> f64 {
    let t0 = rdtsc();
    for _ in 0..iters {
        thread::spawn(|| {}).join().unwrap();
    }
    ns_since(t0) / iters as f64
}

/// Ping-pong through one mutex-protected counter: odd = the partner's turn, even = ours.
/// A round trip is two signal-waits (each side signals the other, then waits).
fn signal_wait(iters: u64) -> f64 {
    const WARM: u64 = 16;
    let shared = Arc::new((Mutex::new(0u64), Condvar::new()));
    let partner = {
        let shared = Arc::clone(&shared);
        thread::spawn(move || {
            let (m, cv) = &*shared;
            let mut turn = m.lock().unwrap();
            for _ in 0..WARM + iters {
                while *turn % 2 == 0 {
                    turn = cv.wait(turn).unwrap();
                }
                *turn += 1;
                cv.notify_one();
            }
        })
    };
    let (m, cv) = &*shared;
    let round_trip = || {
        let mut turn = m.lock().unwrap();
        *turn += 1;
        cv.notify_one();
        while *turn % 2 == 1 {
            turn = cv.wait(turn).unwrap();
        }
    };
    for _ in 0..WARM {
        round_trip();
    }
    let t0 = rdtsc();
    for _ in 0..iters {
        round_trip();
    }
    let ns = ns_since(t0);
    partner.join().unwrap();
    ns / (2 * iters) as f64
}

/// Two threads each calling `yield_now` `iters` times: time per yield. On one vCPU they share
/// it; on two the runtime may place them on different vCPUs.
fn yield_pair(iters: u64) -> f64 {
    let gate = Arc::new(Gate::default());
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let gate = Arc::clone(&gate);
            thread::spawn(move || {
                gate.wait();
                for _ in 0..iters {
                    thread::yield_now();
                }
            })
        })
        .collect();
    let t0 = rdtsc();
    gate.open();
    for t in threads {
        t.join().unwrap();
    }
    ns_since(t0) / (2 * iters) as f64
}

fn mutex_uncontended(iters: u64) -> f64 {
    let m = Mutex::new(0u64);
    let m = black_box(&m);
    let t0 = rdtsc();
    for _ in 0..iters {
        *m.lock().unwrap() += 1;
    }
    let ns = ns_since(t0);
    assert_eq!(*m.lock().unwrap(), iters);
    ns / iters as f64
}

/// Two threads hammering one lock: time per acquisition.
fn mutex_contended(iters: u64) -> f64 {
    let shared = Arc::new((Gate::default(), Mutex::new(0u64)));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let (gate, m) = &*shared;
                gate.wait();
                for _ in 0..iters {
                    *m.lock().unwrap() += 1;
                }
            })
        })
        .collect();
    let t0 = rdtsc();
    shared.0.open();
    for t in threads {
        t.join().unwrap();
    }
    let ns = ns_since(t0);
    assert_eq!(*shared.1.lock().unwrap(), 2 * iters);
    ns / (2 * iters) as f64
}

/// `n` split over `parts`: the share of part `i`.
fn share(n: u64, parts: u64, i: u64) -> u64 {
    n / parts + u64::from(i < n % parts)
}

/// The NPTL paper's creation test: `top` top-level threads together create `total` threads
/// with empty bodies; each keeps at most `children` alive, joining its oldest before creating
/// another. Total time from the first top-level creation to the last join.
fn create(total: u64, top: u64, children: u64) -> f64 {
    let t0 = rdtsc();
    let tops: Vec<_> = (0..top)
        .map(|i| {
            let quota = share(total, top, i);
            thread::spawn(move || {
                let mut alive = VecDeque::with_capacity(children as usize);
                for _ in 0..quota {
                    if alive.len() as u64 == children {
                        let oldest: thread::JoinHandle<()> = alive.pop_front().unwrap();
                        oldest.join().unwrap();
                    }
                    alive.push_back(thread::spawn(|| {}));
                }
                for t in alive {
                    t.join().unwrap();
                }
            })
        })
        .collect();
    for t in tops {
        t.join().unwrap();
    }
    ns_since(t0)
}

/// A critical region: a lock and the counter it protects, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Region(Mutex<u64>);

/// The NPTL paper's contention test (csfast): `threads` threads enter `regions` critical
/// regions `total` times in all, each entry picking a region pseudo-randomly. Total time from
/// opening the start gate to the last join.
fn contention(total: u64, threads: u64, regions: u64) -> f64 {
    let shared = Arc::new((
        Gate::default(),
        (0..regions).map(|_| Region::default()).collect::<Vec<_>>(),
    ));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let shared = Arc::clone(&shared);
            let quota = share(total, threads, i);
            thread::spawn(move || {
                let (gate, regions) = &*shared;
                let mut x = seed(i);
                gate.wait();
                for _ in 0..quota {
                    x = xorshift(x);
                    let region = &regions[(x % regions.len() as u64) as usize];
                    *region.0.lock().unwrap() += 1;
                }
            })
        })
        .collect();
    let t0 = rdtsc();
    shared.0.open();
    for t in handles {
        t.join().unwrap();
    }
    let ns = ns_since(t0);
    let entered: u64 = shared.1.iter().map(|r| *r.0.lock().unwrap()).sum();
    assert_eq!(entered, total);
    ns
}

/// The per-thread random seed all three implementations use.
fn seed(thread: u64) -> u64 {
    0x9E37_79B9_7F4A_7C15u64.wrapping_mul(thread + 1) | 1
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}
