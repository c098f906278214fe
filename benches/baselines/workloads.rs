//! The thread micro-benchmarks' workloads, written once: the NPTL baseline (`nptl.rs`, plain
//! std, also built as the activm std guest `guests/apps/std-threadbench`) and the activm_rt
//! guest (`guests/apps/threadbench`) include this file as their `workloads` module and give it,
//! as their `platform` module, the threads, locks, collections and clock to run on. The
//! benchmark (`benches/benches/threads.rs`) compares the same code on each.
//!
//! Each entry returns nanoseconds: per operation (per signal-wait = round trip / 2, per yield,
//! per acquisition), or the whole trial for `create` and `contention`.

use super::platform::{black_box, now, ns_since, thread, Arc, Condvar, Mutex, Vec, VecDeque};

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

pub(crate) fn null_fork(iters: u64) -> f64 {
    let t0 = now();
    for _ in 0..iters {
        thread::spawn(|| {}).join().unwrap();
    }
    ns_since(t0) / iters as f64
}

/// Ping-pong through one mutex-protected counter: odd = the partner's turn, even = ours.
/// A round trip is two signal-waits (each side signals the other, then waits).
pub(crate) fn signal_wait(iters: u64) -> f64 {
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
    let t0 = now();
    for _ in 0..iters {
        round_trip();
    }
    let ns = ns_since(t0);
    partner.join().unwrap();
    ns / (2 * iters) as f64
}

/// Two threads each calling `yield_now` `iters` times: time per yield. The NPTL baseline pins
/// itself to one CPU first (its children inherit it); on one activm vCPU they share it, on two
/// the runtime may place them on different vCPUs.
pub(crate) fn yield_pair(iters: u64) -> f64 {
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
    let t0 = now();
    gate.open();
    for t in threads {
        t.join().unwrap();
    }
    ns_since(t0) / (2 * iters) as f64
}

pub(crate) fn mutex_uncontended(iters: u64) -> f64 {
    let m = Mutex::new(0u64);
    let m = black_box(&m);
    let t0 = now();
    for _ in 0..iters {
        *m.lock().unwrap() += 1;
    }
    let ns = ns_since(t0);
    assert_eq!(*m.lock().unwrap(), iters);
    ns / iters as f64
}

/// Two threads hammering one lock (on the host's two CPUs, or the guest's vCPUs): time per
/// acquisition.
pub(crate) fn mutex_contended(iters: u64) -> f64 {
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
    let t0 = now();
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
pub(crate) fn create(total: u64, top: u64, children: u64) -> f64 {
    let t0 = now();
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
pub(crate) fn contention(total: u64, threads: u64, regions: u64) -> f64 {
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
    let t0 = now();
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
