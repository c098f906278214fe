//! An ordinary `std` program; `cargo xtask app` turns it into an activm guest.
//!
//! Arguments: `--exit N` ends with status N (default 0); `panic` panics in a thread;
//! `bench-spawn N` / `bench-mutex N` time N spawn+join / uncontended lock+unlock pairs;
//! `detached N` runs N threads whose handles are dropped (a server's thread per connection),
//! at most 64 at a time;
//! `env-clock VAR...` prints `SystemTime::now()` in seconds since the epoch and each `VAR`;
//! `entropy` prints a hash of 0 under a fresh `RandomState` in two threads (its keys come from
//! the OS's random bytes, so the values differ from run to run).

use std::cell::Cell;
use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

thread_local! {
    static PER_THREAD: Cell<u64> = const { Cell::new(0) };
    static STARTS_AT_7: Cell<u64> = const { Cell::new(7) };
    static NAME: std::cell::RefCell<String> = std::cell::RefCell::new(String::from("fresh"));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("panic") => panic_in_thread(),
        Some("bench-spawn") => return bench_spawn(count(&args)),
        Some("bench-mutex") => return bench_mutex(count(&args)),
        Some("detached") => return detached(count(&args)),
        Some("env-clock") => return env_clock(&args[1..]),
        Some("entropy") => return entropy(),
        _ => {}
    }
    let exit = match args.as_slice() {
        [flag, n] if flag == "--exit" => n.parse().unwrap_or(2),
        _ => 0,
    };
    println!("args: {args:?}");
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    println!("available_parallelism: {cpus}");

    // Threads and a Mutex, thread names and thread-locals.
    let counter = Arc::new(Mutex::new(0u64));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let counter = Arc::clone(&counter);
            thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    for _ in 0..10_000 {
                        *counter.lock().unwrap() += 1;
                        PER_THREAD.set(PER_THREAD.get() + 1);
                    }
                    format!("{}={}", thread::current().name().unwrap(), PER_THREAD.get())
                })
                .unwrap()
        })
        .collect();
    let names: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    println!("mutex: {}", *counter.lock().unwrap());
    println!("threads: {}", names.join(" "));
    println!("main thread-local: {}", PER_THREAD.get());

    // Threads one after the other (each may run on the control block the last one left): every
    // one starts with the initial values, whatever the previous one wrote.
    let seen: Vec<String> = (0..3)
        .map(|i| {
            thread::spawn(move || {
                let seen = format!(
                    "{}/{}/{}",
                    PER_THREAD.get(),
                    STARTS_AT_7.get(),
                    NAME.with_borrow(|n| n.clone())
                );
                PER_THREAD.set(100 + i);
                STARTS_AT_7.set(200 + i);
                NAME.with_borrow_mut(|n| n.push_str("-used"));
                seen
            })
            .join()
            .unwrap()
        })
        .collect();
    println!("thread-locals in successive threads: {}", seen.join(" "));

    // A Condvar ping-pong between two threads.
    let turn = Arc::new((Mutex::new(0u32), Condvar::new()));
    let other = Arc::clone(&turn);
    let pong = thread::spawn(move || {
        let (m, cv) = &*other;
        for _ in 0..1000 {
            let mut g = cv.wait_while(m.lock().unwrap(), |t| *t % 2 == 0).unwrap();
            *g += 1;
            cv.notify_one();
        }
    });
    {
        let (m, cv) = &*turn;
        for _ in 0..1000 {
            let mut g = cv.wait_while(m.lock().unwrap(), |t| *t % 2 == 1).unwrap();
            *g += 1;
            cv.notify_one();
        }
    }
    pong.join().unwrap();
    println!("condvar: {} turns", *turn.0.lock().unwrap());

    // Channels: four producers, one consumer; a rendezvous channel.
    let (tx, rx) = mpsc::channel();
    for p in 0..4u64 {
        let tx = tx.clone();
        thread::spawn(move || (0..1000).for_each(|i| tx.send(p * 1000 + i).unwrap()));
    }
    drop(tx);
    println!("channel: sum {}", rx.iter().sum::<u64>());
    let (tx, rx) = mpsc::sync_channel(0);
    let producer = thread::spawn(move || (1..=100u32).for_each(|i| tx.send(i).unwrap()));
    println!("sync_channel: sum {}", rx.iter().sum::<u32>());
    producer.join().unwrap();

    // RwLock, Barrier, scoped threads.
    let table = RwLock::new(vec![0u32; 16]);
    let barrier = Barrier::new(4);
    thread::scope(|s| {
        for i in 0..4 {
            let (table, barrier) = (&table, &barrier);
            s.spawn(move || {
                table.write().unwrap()[i] = i as u32 + 1;
                barrier.wait();
                assert_eq!(table.read().unwrap().iter().sum::<u32>(), 10);
            });
        }
    });
    println!("scoped+rwlock+barrier: {:?}", &table.read().unwrap()[..4]);

    // Time: sleep and a Condvar timeout.
    let t0 = Instant::now();
    thread::sleep(Duration::from_millis(20));
    let slept = t0.elapsed();
    let ok = slept >= Duration::from_millis(20) && slept < Duration::from_secs(1);
    println!("sleep 20ms: {}", if ok { "ok" } else { "WRONG" });
    let (m, cv) = (Mutex::new(()), Condvar::new());
    let t0 = Instant::now();
    let (_g, r) = cv
        .wait_timeout(m.lock().unwrap(), Duration::from_millis(10))
        .unwrap();
    let ok = r.timed_out() && t0.elapsed() >= Duration::from_millis(10);
    println!("wait_timeout 10ms: {}", if ok { "ok" } else { "WRONG" });
    // A timed wait that a notification ends before its deadline.
    let flag = Arc::new((Mutex::new(false), Condvar::new()));
    let setter = {
        let flag = Arc::clone(&flag);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            *flag.0.lock().unwrap() = true;
            flag.1.notify_all();
        })
    };
    let (g, r) = flag
        .1
        .wait_timeout_while(flag.0.lock().unwrap(), Duration::from_secs(10), |set| !*set)
        .unwrap();
    let ok = *g && !r.timed_out();
    drop(g);
    setter.join().unwrap();
    println!("wait_timeout notified: {}", if ok { "ok" } else { "WRONG" });

    // One initialisation for many threads (OnceLock waits on a futex).
    static ONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let inits = Arc::new(Mutex::new(0));
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let inits = Arc::clone(&inits);
            thread::spawn(move || {
                *ONCE.get_or_init(|| {
                    *inits.lock().unwrap() += 1;
                    thread::sleep(Duration::from_millis(2));
                    42
                })
            })
        })
        .collect();
    let seen: u64 = racers.into_iter().map(|r| r.join().unwrap()).sum();
    println!("once: {} inits, sum {seen}", *inits.lock().unwrap());
    let mut seed = [0u8; 16];
    // std's HashMap keys come from the entropy source: two maps must still work.
    let map: std::collections::HashMap<u32, u32> = (0..100).map(|i| (i, i * i)).collect();
    seed[0] = map[&9] as u8;
    println!("hashmap: {}", seed[0]);
    println!("done");
    std::process::exit(exit);
}

fn panic_in_thread() -> ! {
    let h = thread::Builder::new()
        .name("doomed".into())
        .spawn(|| panic!("boom"))
        .unwrap();
    let _ = h.join();
    unreachable!("the panic aborts the guest");
}

/// `now: SECS` (the wall clock, seconds since the UNIX epoch), then `VAR: Some("value")` or
/// `VAR: None` for each name, then how many variables the environment holds.
fn env_clock(names: &[String]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!("now: {now}");
    for name in names {
        println!("{name}: {:?}", std::env::var(name).ok());
    }
    println!("vars: {}", std::env::vars().count());
}

fn entropy() {
    use std::hash::BuildHasher;
    let hash = || std::collections::hash_map::RandomState::new().hash_one(0u64);
    let other = thread::spawn(hash).join().unwrap();
    println!("random hashes: {:016x} {other:016x}", hash());
}

fn count(args: &[String]) -> u32 {
    args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10_000)
}

fn bench_spawn(n: u32) {
    let t0 = Instant::now();
    for _ in 0..n {
        thread::spawn(|| {}).join().unwrap();
    }
    println!("spawn+join: {} ns", t0.elapsed().as_nanos() / u128::from(n));
}

fn bench_mutex(n: u32) {
    let m = Mutex::new(0u64);
    let t0 = Instant::now();
    for _ in 0..n {
        *m.lock().unwrap() += 1;
    }
    println!(
        "mutex lock+unlock: {} ns",
        t0.elapsed().as_nanos() / u128::from(n)
    );
}

/// N detached threads, at most 64 unfinished at a time: what a finished one keeps must be
/// small (a thread per connection, for as long as the server runs).
fn detached(n: u32) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static DONE: AtomicU32 = AtomicU32::new(0);
    for i in 0..n {
        while i - DONE.load(Ordering::Acquire) >= 64 {
            thread::yield_now();
        }
        drop(thread::spawn(|| {
            DONE.fetch_add(1, Ordering::Release);
        }));
    }
    while DONE.load(Ordering::Acquire) < n {
        thread::yield_now();
    }
    println!("detached: {n} threads finished");
}
