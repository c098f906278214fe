//! `rt-tests bench [NAME...]`: quick timings of the runtime's basic operations (rdtsc loops),
//! one line each: `bench NAME: X ns/op (N ops)`.

use alloc::vec::Vec;
use core::hint::black_box;

use activm_rt::rt;
use activm_rt::sync::{mpsc, Arc, Condvar, Mutex};
use activm_rt::{println, thread};

fn report(name: &str, ops: u64, ticks: u64) {
    let ns = rt::ticks_to_ns(ticks);
    println!(
        "bench {name}: {}.{:02} ns/op ({ops} ops, {} vCPUs)",
        ns / ops,
        (ns % ops) * 100 / ops,
        rt::nr_vcpus()
    );
}

fn timed(f: impl FnOnce()) -> u64 {
    let t = rt::rdtsc();
    f();
    rt::rdtsc() - t
}

fn null_fork() {
    const N: u64 = 20_000;
    for _ in 0..1000 {
        thread::spawn(|| {}).join().unwrap();
    }
    report(
        "null-fork (spawn+join)",
        N,
        timed(|| {
            for _ in 0..N {
                thread::spawn(|| {}).join().unwrap();
            }
        }),
    );
}

fn spawn_burst() {
    const N: u64 = 10_000;
    let t = timed(|| {
        let hs: Vec<_> = (0..N)
            .map(|i| thread::spawn(move || black_box(i)))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    report("spawn-10000-then-join (per thread)", N, t);
}

fn yield_pingpong() {
    const N: u64 = 200_000;
    let other = thread::spawn(|| {
        for _ in 0..N {
            thread::yield_now();
        }
    });
    let t = timed(|| {
        for _ in 0..N {
            thread::yield_now();
        }
    });
    other.join().unwrap();
    report("yield (2 threads, per switch)", 2 * N, t);
}

fn condvar_pingpong() {
    const N: u64 = 100_000;
    let pair = Arc::new((Mutex::new(false), Condvar::new(), Condvar::new()));
    let other = {
        let pair = pair.clone();
        thread::spawn(move || {
            let (m, ping, pong) = &*pair;
            let mut ball = m.lock().unwrap();
            for _ in 0..N {
                while !*ball {
                    ball = ping.wait(ball).unwrap();
                }
                *ball = false;
                pong.notify_one();
            }
        })
    };
    let t = timed(|| {
        let (m, ping, pong) = &*pair;
        let mut ball = m.lock().unwrap();
        for _ in 0..N {
            *ball = true;
            ping.notify_one();
            while *ball {
                ball = pong.wait(ball).unwrap();
            }
        }
    });
    other.join().unwrap();
    report("condvar signal-wait (per one-way hand-off)", 2 * N, t);
}

fn mutex_uncontended() {
    const N: u64 = 10_000_000;
    let m = Mutex::new(0u64);
    let t = timed(|| {
        for _ in 0..N {
            *m.lock().unwrap() += 1;
        }
    });
    black_box(&m);
    report("mutex lock+unlock, uncontended", N, t);
}

fn atomic_rmw() {
    const N: u64 = 10_000_000;
    let a = core::sync::atomic::AtomicU64::new(0);
    let t = timed(|| {
        for _ in 0..N {
            a.fetch_add(1, core::sync::atomic::Ordering::AcqRel);
        }
    });
    black_box(&a);
    report("one locked RMW (lock xadd), for scale", N, t);
}

fn channel_pingpong() {
    const N: u64 = 100_000;
    let (tx1, rx1) = mpsc::channel::<u64>();
    let (tx2, rx2) = mpsc::channel::<u64>();
    let other = thread::spawn(move || {
        for v in rx1.iter() {
            tx2.send(v + 1).unwrap();
        }
    });
    let t = timed(|| {
        for i in 0..N {
            tx1.send(i).unwrap();
            black_box(rx2.recv().unwrap());
        }
    });
    drop(tx1);
    other.join().unwrap();
    report("channel round trip", N, t);
}

fn sleep_short() {
    const N: u64 = 200;
    let t = timed(|| {
        for _ in 0..N {
            thread::sleep(core::time::Duration::from_micros(500));
        }
    });
    report("sleep(500 us)", N, t);
}

pub fn run(names: &[&str]) -> i32 {
    let all: [(&str, fn()); 8] = [
        ("rmw", atomic_rmw),
        ("null-fork", null_fork),
        ("spawn-burst", spawn_burst),
        ("yield", yield_pingpong),
        ("condvar", condvar_pingpong),
        ("mutex", mutex_uncontended),
        ("channel", channel_pingpong),
        ("sleep", sleep_short),
    ];
    for (name, f) in all {
        if names.is_empty() || names.contains(&name) {
            f();
        }
    }
    0
}
