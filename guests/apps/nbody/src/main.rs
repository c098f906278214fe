//! Overcommit workloads (Anderson et al. 1992, Table V), for `cargo xtask bench overcommit`:
//!
//! * `nbody BODIES STEPS THREADS`: direct O(N^2) gravitational N-body in f64; the threads each
//!   own a slice of the bodies and meet at a barrier twice per step (after the forces, after the
//!   positions), as a data-parallel simulation does.
//! * `nbody-for BODIES MS THREADS`: the same, stepping until MS milliseconds have passed (a
//!   batch job beside another guest, for `bench latency`); reports steps per second.
//! * `locks THREADS ENTRIES LOCKS`: THREADS threads make ENTRIES entries in total into LOCKS
//!   short critical sections (a few hundred instructions each), the case lock-holder preemption
//!   hurts most.
//! * `spawn THREADS [ROUNDS]`: spawns THREADS empty threads, all live at once (a thread's stack is
//!   bound only when it first runs), then joins them: the scale benchmark (`cargo xtask bench
//!   scale`). Later rounds (`ROUNDS` > 1) reuse memory the first one touched and print `warm_ms=`
//!   (their best) on the same line: first touch of guest RAM against the runtime's own cost.
//!
//! Each prints one `RESULT name ms=... check=...` line and exits 0.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cell::UnsafeCell;

use activm_rt::sync::{Barrier, Mutex};
use activm_rt::thread;
use activm_stub::{println, rdtsc, tsc_khz};

activm_rt::main!(main);

fn main(args: &[&str]) -> i32 {
    let number =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    match args.first().copied() {
        Some("nbody") => nbody(number(1, 1024), Steps::Count(number(2, 10)), number(3, 4)),
        Some("nbody-for") => nbody(
            number(1, 1024),
            Steps::ForMs(number(2, 1000) as u64),
            number(3, 4),
        ),
        Some("locks") => locks(number(1, 32), number(2, 200_000), number(3, 4)),
        Some("spawn") => spawn(number(1, 10_000), number(2, 1)),
        _ => {
            println!(
                "usage: nbody BODIES STEPS THREADS | nbody-for BODIES MS THREADS | locks THREADS ENTRIES LOCKS | spawn THREADS [ROUNDS]"
            );
            2
        }
    }
}

fn elapsed_ms(start: u64) -> f64 {
    (rdtsc() - start) as f64 / tsc_khz() as f64
}

#[derive(Clone, Copy, Default)]
struct Body {
    pos: [f64; 3],
    vel: [f64; 3],
    acc: [f64; 3],
    mass: f64,
}

/// Bodies shared by the worker threads: each writes only its own slice between barriers.
struct Bodies(UnsafeCell<Vec<Body>>);

// SAFETY: the threads write disjoint slices, and reads of other slices happen only after a
// barrier that orders them after every write of the previous phase.
unsafe impl Sync for Bodies {}

/// A deterministic pseudo-random number in [0, 1).
fn lcg(state: &mut u64) -> f64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*state >> 11) as f64 / (1u64 << 53) as f64
}

/// How long `nbody` runs: a number of steps, or steps until a time has passed.
#[derive(Clone, Copy)]
enum Steps {
    Count(usize),
    ForMs(u64),
}

fn nbody(n: usize, steps: Steps, threads: usize) -> i32 {
    use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    static DONE: AtomicUsize = AtomicUsize::new(0);
    let threads = threads.clamp(1, n);
    let mut seed = 42u64;
    let bodies: Vec<Body> = (0..n)
        .map(|_| Body {
            pos: [lcg(&mut seed), lcg(&mut seed), lcg(&mut seed)],
            mass: 1.0 + lcg(&mut seed),
            ..Body::default()
        })
        .collect();
    let bodies = Arc::new(Bodies(UnsafeCell::new(bodies)));
    let barrier = Arc::new(Barrier::new(threads));
    let start = rdtsc();
    let deadline = match steps {
        Steps::Count(_) => u64::MAX,
        Steps::ForMs(ms) => start + ms * tsc_khz(),
    };
    let max_steps = match steps {
        Steps::Count(count) => count,
        Steps::ForMs(_) => usize::MAX,
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let bodies = Arc::clone(&bodies);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let (lo, hi) = (t * n / threads, (t + 1) * n / threads);
                for step in 0..max_steps {
                    // SAFETY: see `Bodies`: all reads in this phase, writes only to [lo, hi).
                    let all = unsafe { &mut *bodies.0.get() };
                    for i in lo..hi {
                        let mut acc = [0.0f64; 3];
                        let p = all[i].pos;
                        for other in all.iter() {
                            let d = [
                                other.pos[0] - p[0],
                                other.pos[1] - p[1],
                                other.pos[2] - p[2],
                            ];
                            let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + 1e-3;
                            let inv = other.mass / (r2 * sqrt(r2));
                            acc[0] += d[0] * inv;
                            acc[1] += d[1] * inv;
                            acc[2] += d[2] * inv;
                        }
                        all[i].acc = acc;
                    }
                    barrier.wait();
                    for body in &mut all[lo..hi] {
                        for k in 0..3 {
                            body.vel[k] += 1e-4 * body.acc[k];
                            body.pos[k] += 1e-4 * body.vel[k];
                        }
                    }
                    // Thread 0 decides between the barriers; everyone reads after the second.
                    if t == 0 {
                        DONE.store(step + 1, Ordering::Relaxed);
                        STOP.store(rdtsc() >= deadline, Ordering::Relaxed);
                    }
                    barrier.wait();
                    if STOP.load(Ordering::Relaxed) {
                        break;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    let ms = elapsed_ms(start);
    // SAFETY: every worker has been joined.
    let all = unsafe { &*bodies.0.get() };
    let check: f64 = all.iter().map(|b| b.pos[0] + b.pos[1] + b.pos[2]).sum();
    let steps = DONE.load(Ordering::Relaxed);
    println!(
        "RESULT nbody bodies={n} steps={steps} threads={threads} ms={ms:.3} steps_per_s={:.3} check={check:.9}",
        steps as f64 * 1000.0 / ms
    );
    0
}

/// Square root with SSE2 (no libm in no_std).
#[cfg(target_arch = "x86_64")]
fn sqrt(x: f64) -> f64 {
    let result: f64;
    // SAFETY: sqrtsd only reads and writes xmm registers.
    unsafe {
        core::arch::asm!("sqrtsd {0}, {0}", inout(xmm_reg) x => result, options(pure, nomem, nostack))
    };
    result
}

/// Square root with the FP unit's `fsqrt` (no libm in no_std).
#[cfg(target_arch = "aarch64")]
fn sqrt(x: f64) -> f64 {
    let result: f64;
    // SAFETY: fsqrt only reads and writes FP registers.
    unsafe {
        core::arch::asm!("fsqrt {0:d}, {0:d}", inout(vreg) x => result, options(pure, nomem, nostack))
    };
    result
}

fn locks(threads: usize, entries: usize, nlocks: usize) -> i32 {
    let threads = threads.max(1);
    let nlocks = nlocks.max(1);
    let counters: Arc<Vec<Mutex<u64>>> = Arc::new((0..nlocks).map(|_| Mutex::new(0)).collect());
    let per_thread = entries / threads;
    let start = rdtsc();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let counters = Arc::clone(&counters);
            thread::spawn(move || {
                let mut seed = t as u64 + 1;
                for i in 0..per_thread {
                    let lock = (t + i) % nlocks;
                    let mut guard = counters[lock].lock().unwrap();
                    // A short critical section: a little arithmetic on the protected value.
                    let mut v = *guard;
                    for _ in 0..50 {
                        v = core::hint::black_box(v.wrapping_mul(3).wrapping_add(1) % 1_000_003);
                    }
                    core::hint::black_box(v);
                    *guard = guard.wrapping_add(1);
                    drop(guard);
                    // Some work outside.
                    for _ in 0..20 {
                        seed = core::hint::black_box(
                            seed.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    let ms = elapsed_ms(start);
    let total: u64 = counters.iter().map(|c| *c.lock().unwrap()).sum();
    let expected = (per_thread * threads) as u64;
    println!(
        "RESULT locks threads={threads} entries={expected} locks={nlocks} ms={ms:.3} check={total}"
    );
    if total == expected {
        0
    } else {
        1
    }
}

fn spawn(threads: usize, rounds: usize) -> i32 {
    let heap_before = activm_stub::heap::used();
    let (ms, spawned_ms, check, heap_peak) = spawn_round(threads);
    let bytes_per_thread = heap_peak.saturating_sub(heap_before) / threads.max(1);
    let mut warm_ms = f64::INFINITY;
    let mut all_ran = check == threads;
    for _ in 1..rounds {
        let (ms, _, check, _) = spawn_round(threads);
        warm_ms = warm_ms.min(ms);
        all_ran &= check == threads;
    }
    // `ms=` first: the benchmarks read the first `ms=` of the line.
    if rounds > 1 {
        println!(
            "RESULT spawn threads={threads} ms={ms:.3} spawning={spawned_ms:.3} warm_ms={warm_ms:.3} heap_per_thread={bytes_per_thread} check={check}"
        );
    } else {
        println!(
            "RESULT spawn threads={threads} ms={ms:.3} spawning={spawned_ms:.3} heap_per_thread={bytes_per_thread} check={check}"
        );
    }
    i32::from(!all_ran)
}

/// One round: (total ms, ms until the last spawn, threads that ran, heap bytes in use once
/// all were spawned).
fn spawn_round(threads: usize) -> (f64, f64, usize, usize) {
    let ran = Arc::new(core::sync::atomic::AtomicUsize::new(0));
    let start = rdtsc();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let ran = Arc::clone(&ran);
            thread::spawn(move || {
                ran.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            })
        })
        .collect();
    let spawned_ms = elapsed_ms(start);
    let heap_peak = activm_stub::heap::used();
    let join_start = rdtsc();
    for handle in handles {
        let _ = handle.join();
    }
    let ms = spawned_ms + elapsed_ms(join_start);
    (
        ms,
        spawned_ms,
        ran.load(core::sync::atomic::Ordering::Relaxed),
        heap_peak,
    )
}
