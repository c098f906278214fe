//! Thread micro-benchmarks on host Linux threads: `std::thread` is NPTL's pthreads, and std's
//! `Mutex`/`Condvar` are futex-based, so this is NPTL with futex locks.
//!
//! The same operations, arguments and output as the Go baseline (`baselines/go`) and the activm
//! guest (`guests/apps/threadbench`); `benches/benches/threads.rs` runs all three.
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

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Instant;

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

fn ns_since(t0: Instant) -> f64 {
    t0.elapsed().as_nanos() as f64
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
    let t0 = Instant::now();
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
    let t0 = Instant::now();
    for _ in 0..iters {
        round_trip();
    }
    let ns = ns_since(t0);
    partner.join().unwrap();
    ns / (2 * iters) as f64
}

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

/// Two threads on one CPU (the caller pinned itself to CPU 0; children inherit it), each
/// calling `sched_yield` `iters` times: time per yield.
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
    let t0 = Instant::now();
    gate.open();
    for t in threads {
        t.join().unwrap();
    }
    ns_since(t0) / (2 * iters) as f64
}

fn mutex_uncontended(iters: u64) -> f64 {
    let m = Mutex::new(0u64);
    let m = black_box(&m);
    let t0 = Instant::now();
    for _ in 0..iters {
        *m.lock().unwrap() += 1;
    }
    let ns = ns_since(t0);
    assert_eq!(*m.lock().unwrap(), iters);
    ns / iters as f64
}

/// Two threads (on the host's two CPUs) hammering one lock: time per acquisition.
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
    let t0 = Instant::now();
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
    let t0 = Instant::now();
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
    let t0 = Instant::now();
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
