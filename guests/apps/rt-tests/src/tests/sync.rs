//! Locks, condition variables, semaphores, barriers and channels.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;

use activm_rt::rt;
use activm_rt::sync::mpsc;
use activm_rt::sync::{Arc, Barrier, Condvar, Mutex, RwLock, Semaphore};
use activm_rt::thread;

use crate::TestResult;

use super::{ensure, ns_ticks, since_ns, wait_until};

pub(super) fn mutex() -> TestResult {
    const THREADS: u64 = 8;
    const ITERS: u64 = 20_000;
    let m = Arc::new(Mutex::new(0u64));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let m = m.clone();
            thread::spawn(move || {
                for i in 0..ITERS {
                    let mut g = m.lock().unwrap();
                    *g += 1;
                    if i % 1000 == 0 {
                        // Hold it across a switch now and then.
                        thread::yield_now();
                    }
                    drop(g);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = *m.lock().unwrap();
    ensure(total == THREADS * ITERS, || {
        format!("total {total}, expected {}", THREADS * ITERS)
    })?;
    let g = m.lock().unwrap();
    ensure(m.try_lock().is_err(), || {
        "try_lock succeeded on a held mutex".into()
    })?;
    drop(g);
    ensure(m.try_lock().is_ok(), || {
        "try_lock failed on a free mutex".into()
    })?;
    Ok(format!("{THREADS} threads x {ITERS}"))
}

pub(super) fn condvar() -> TestResult {
    const PRODUCERS: u64 = 4;
    const ITEMS: u64 = 5_000;
    const CAP: usize = 16;
    struct Q {
        items: Mutex<VecDeque<u64>>,
        not_empty: Condvar,
        not_full: Condvar,
    }
    let q = Arc::new(Q {
        items: Mutex::new(VecDeque::new()),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
    });
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..ITEMS {
                    let mut items = q.items.lock().unwrap();
                    while items.len() >= CAP {
                        items = q.not_full.wait(items).unwrap();
                    }
                    items.push_back(p * ITEMS + i);
                    drop(items);
                    q.not_empty.notify_one();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let (mut sum, mut n) = (0u64, 0u64);
                loop {
                    let mut items = q.items.lock().unwrap();
                    let item = loop {
                        if let Some(item) = items.pop_front() {
                            break item;
                        }
                        items = q.not_empty.wait(items).unwrap();
                    };
                    drop(items);
                    q.not_full.notify_one();
                    if item == u64::MAX {
                        return (sum, n);
                    }
                    sum += item;
                    n += 1;
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    for _ in 0..4 {
        let mut items = q.items.lock().unwrap();
        items.push_back(u64::MAX);
        drop(items);
        q.not_empty.notify_all();
    }
    let (mut sum, mut n) = (0, 0);
    for c in consumers {
        let (s, k) = c.join().unwrap();
        sum += s;
        n += k;
    }
    let total = PRODUCERS * ITEMS;
    ensure(n == total && sum == total * (total - 1) / 2, || {
        format!("consumed {n} items summing {sum}")
    })?;
    // Ping-pong.
    let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
    let other = {
        let pair = pair.clone();
        thread::spawn(move || {
            let (m, cv) = &*pair;
            let mut turn = m.lock().unwrap();
            for i in 0..1000 {
                while *turn != 2 * i + 1 {
                    turn = cv.wait(turn).unwrap();
                }
                *turn += 1;
                cv.notify_one();
            }
        })
    };
    {
        let (m, cv) = &*pair;
        let mut turn = m.lock().unwrap();
        for i in 0..1000 {
            while *turn != 2 * i {
                turn = cv.wait(turn).unwrap();
            }
            *turn += 1;
            cv.notify_one();
        }
    }
    other.join().unwrap();
    Ok(format!(
        "{total} items through a {CAP}-slot queue, 1000 ping-pongs"
    ))
}

pub(super) fn rwlock() -> TestResult {
    let lock = Arc::new(RwLock::new((0u64, 0u64)));
    let bad = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let lock = lock.clone();
            thread::spawn(move || {
                for i in 0..2000 {
                    let mut g = lock.write().unwrap();
                    g.0 += 1;
                    if i % 100 == 0 {
                        thread::yield_now();
                    }
                    g.1 += 1;
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (lock, bad, reads) = (lock.clone(), bad.clone(), reads.clone());
            thread::spawn(move || {
                for i in 0..5000 {
                    let g = lock.read().unwrap();
                    if g.0 != g.1 {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    if i % 500 == 0 {
                        thread::yield_now();
                    }
                    drop(g);
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in writers.into_iter().chain(readers) {
        h.join().unwrap();
    }
    let g = lock.read().unwrap();
    ensure(*g == (8000, 8000), || format!("final state {:?}", *g))?;
    ensure(bad.load(Ordering::Relaxed) == 0, || {
        format!(
            "{} reads saw a half-done write",
            bad.load(Ordering::Relaxed)
        )
    })?;
    ensure(lock.try_write().is_err(), || {
        "try_write succeeded while read-locked".into()
    })?;
    drop(g);
    ensure(lock.try_write().is_ok(), || {
        "try_write failed on a free lock".into()
    })?;
    Ok(format!(
        "4 writers x 2000, {} reads",
        reads.load(Ordering::Relaxed)
    ))
}

pub(super) fn semaphore() -> TestResult {
    const PERMITS: usize = 3;
    let sem = Arc::new(Semaphore::new(PERMITS));
    let inside = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..12)
        .map(|_| {
            let (sem, inside, max) = (sem.clone(), inside.clone(), max.clone());
            thread::spawn(move || {
                for _ in 0..200 {
                    let _permit = sem.access();
                    let now = inside.fetch_add(1, Ordering::AcqRel) + 1;
                    max.fetch_max(now, Ordering::AcqRel);
                    thread::yield_now();
                    inside.fetch_sub(1, Ordering::AcqRel);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let max = max.load(Ordering::Relaxed);
    ensure(max <= PERMITS && max > 0, || {
        format!("{max} threads inside at once")
    })?;
    ensure(sem.available_permits() == PERMITS, || {
        format!("{} permits left", sem.available_permits())
    })?;
    // PERMITS permits admit PERMITS threads at once: each holds its permit until all are
    // inside (a semaphore that admits fewer never gets there), and one more is refused then.
    let inside = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(AtomicBool::new(false));
    let deadline = rt::rdtsc() + ns_ticks(10_000_000_000);
    let holders: Vec<_> = (0..PERMITS)
        .map(|_| {
            let (sem, inside, release) = (sem.clone(), inside.clone(), release.clone());
            thread::spawn(move || {
                let _permit = sem.access();
                inside.fetch_add(1, Ordering::AcqRel);
                while !release.load(Ordering::Acquire) {
                    thread::yield_now();
                }
            })
        })
        .collect();
    while inside.load(Ordering::Acquire) < PERMITS && rt::rdtsc() < deadline {
        thread::yield_now();
    }
    let got_in = inside.load(Ordering::Acquire);
    let one_more = sem.try_acquire();
    if one_more {
        sem.release();
    }
    release.store(true, Ordering::Release);
    for h in holders {
        h.join().unwrap();
    }
    ensure(got_in == PERMITS && !one_more, || {
        format!("{PERMITS} permits admitted {got_in} threads at once (one more: {one_more})")
    })?;
    ensure(sem.available_permits() == PERMITS, || {
        format!("{} permits left after the holders", sem.available_permits())
    })?;
    Ok(format!(
        "12 threads, at most {max} of {PERMITS} inside; {PERMITS} held at once"
    ))
}

pub(super) fn barrier() -> TestResult {
    const N: usize = 6;
    const ROUNDS: usize = 50;
    let barrier = Arc::new(Barrier::new(N));
    let arrived: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let leaders: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let bad = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..N)
        .map(|_| {
            let (b, arrived, leaders, bad) = (
                barrier.clone(),
                arrived.clone(),
                leaders.clone(),
                bad.clone(),
            );
            thread::spawn(move || {
                for r in 0..ROUNDS {
                    arrived[r].fetch_add(1, Ordering::AcqRel);
                    if b.wait().is_leader() {
                        leaders[r].fetch_add(1, Ordering::AcqRel);
                    }
                    if arrived[r].load(Ordering::Acquire) != N {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    ensure(bad.load(Ordering::Relaxed) == 0, || {
        "a thread passed the barrier early".into()
    })?;
    ensure(
        leaders.iter().all(|l| l.load(Ordering::Relaxed) == 1),
        || "not exactly one leader per round".into(),
    )?;
    Ok(format!("{N} threads x {ROUNDS} rounds"))
}

pub(super) fn mpsc_channels() -> TestResult {
    const SENDERS: u64 = 8;
    const MSGS: u64 = 2000;
    let (tx, rx) = mpsc::channel::<u64>();
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let tx = tx.clone();
            thread::spawn(move || {
                for i in 0..MSGS {
                    tx.send(s * MSGS + i).unwrap();
                    if i % 256 == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let (mut n, mut sum) = (0u64, 0u64);
    for v in rx.iter() {
        n += 1;
        sum += v;
    }
    for s in senders {
        s.join().unwrap();
    }
    let total = SENDERS * MSGS;
    ensure(n == total && sum == total * (total - 1) / 2, || {
        format!("received {n} messages summing {sum}")
    })?;
    ensure(rx.recv().is_err(), || "recv after every sender left".into())?;
    // Bounded.
    let (tx, rx) = mpsc::sync_channel::<u64>(4);
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let tx = tx.clone();
            thread::spawn(move || {
                for i in 0..1000 {
                    tx.send(i).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let got: u64 = rx.iter().count() as u64;
    for p in producers {
        p.join().unwrap();
    }
    ensure(got == 2000, || format!("bounded channel delivered {got}"))?;
    let (tx, rx) = mpsc::channel::<u8>();
    drop(rx);
    ensure(tx.send(1).is_err(), || {
        "send to a dropped receiver succeeded".into()
    })?;
    Ok(format!(
        "{total} messages from {SENDERS} senders; 2000 through a 4-slot channel"
    ))
}

/// `Condvar::wait_timeout` on the runtime's timer: a timeout fires on time (never early), a
/// notification before the deadline wins and cancels the timeout (the cancelled timer never
/// wakes the thread later), many timed waiters at once, and notifications racing deadlines.
pub(super) fn condvar_timeout() -> TestResult {
    let pair = Arc::new((Mutex::new(0u64), Condvar::new()));
    let (m, cv) = &*pair;

    // 1. Nobody notifies: times out, never early, not much later. A round that ends far out
    // (a loaded host scheduling a halted vCPU's thread late) is tried again, up to 3 rounds.
    let mut late_max = u64::MAX;
    for _round in 0..3 {
        late_max = 0;
        for us in [200u64, 2_000, 10_000] {
            let t0 = rt::rdtsc();
            let (g, r) = cv
                .wait_timeout(m.lock().unwrap(), Duration::from_micros(us))
                .unwrap();
            let took = since_ns(t0);
            drop(g);
            ensure(r.timed_out(), || format!("{us} us wait: not timed out"))?;
            ensure(took >= us * 1000, || {
                format!("{us} us wait returned after {took} ns")
            })?;
            late_max = late_max.max(took - us * 1000);
        }
        if late_max < 50_000_000 {
            break;
        }
    }
    ensure(late_max < 50_000_000, || {
        format!("timeout {late_max} ns late (3 rounds)")
    })?;

    // 2. Notified after 1 ms of a 200 ms timeout: returns early, not timed out; then a plain
    // wait across the cancelled deadline must not be woken by it (waits never wake spuriously
    // here).
    let wakeups = Arc::new(AtomicU32::new(0));
    let waiter = {
        let (pair, wakeups) = (pair.clone(), wakeups.clone());
        thread::spawn(move || {
            let (m, cv) = &*pair;
            let mut g = m.lock().unwrap();
            *g = 1; // waiting
            let t0 = rt::rdtsc();
            let (g2, r) = cv.wait_timeout(g, Duration::from_millis(200)).unwrap();
            let took = since_ns(t0);
            g = g2;
            let first = (r.timed_out(), took, *g);
            *g = 3; // waiting again, without a timeout
            while *g == 3 {
                g = cv.wait(g).unwrap();
                wakeups.fetch_add(1, Ordering::Relaxed);
            }
            first
        })
    };
    ensure(
        wait_until(Duration::from_secs(5), || *m.lock().unwrap() == 1),
        || "waiter never waited".into(),
    )?;
    thread::sleep(Duration::from_millis(1));
    *m.lock().unwrap() = 2;
    cv.notify_one();
    ensure(
        wait_until(Duration::from_secs(5), || *m.lock().unwrap() == 3),
        || "notified waiter never came back".into(),
    )?;
    thread::sleep(Duration::from_millis(220)); // past the cancelled deadline
    *m.lock().unwrap() = 4;
    cv.notify_one();
    let (timed_out, took, seen) = waiter.join().unwrap();
    ensure(!timed_out && seen == 2, || {
        format!("notified wait: timed_out {timed_out}, state {seen}")
    })?;
    ensure(took < 190_000_000, || {
        format!("notified wait took {took} ns")
    })?;
    let w = wakeups.load(Ordering::Relaxed);
    ensure(w == 1, || {
        format!("plain wait woke {w} times (the cancelled timer woke it?)")
    })?;

    // 3. Many timed waiters at once: 32 with a long timeout on one condvar (all notified),
    // 32 with 1-5 ms timeouts on another (all time out), interleaved in the sleepers' list.
    const N: u64 = 32;
    let many = Arc::new((Mutex::new(0u64), Condvar::new(), Condvar::new()));
    let mut handles = Vec::new();
    for i in 0..2 * N {
        let many = many.clone();
        handles.push(thread::spawn(move || {
            let (m, long, short) = &*many;
            let (cv, dur) = if i % 2 == 0 {
                (long, Duration::from_secs(10))
            } else {
                (short, Duration::from_micros(1000 + (i % 5) * 1000))
            };
            let mut g = m.lock().unwrap();
            *g += 1;
            let t0 = rt::rdtsc();
            let (g, r) = cv.wait_timeout(g, dur).unwrap();
            drop(g);
            (i, r.timed_out(), since_ns(t0), dur)
        }));
    }
    ensure(
        wait_until(Duration::from_secs(5), || *many.0.lock().unwrap() == 2 * N),
        || "timed waiters never all waited".into(),
    )?;
    thread::sleep(Duration::from_millis(10));
    many.1.notify_all();
    for h in handles {
        let (i, timed_out, took, dur) = h.join().unwrap();
        let want_timeout = i % 2 == 1;
        ensure(timed_out == want_timeout, || {
            format!("waiter {i}: timed_out {timed_out}, after {took} ns")
        })?;
        ensure(!timed_out || took >= dur.as_nanos() as u64, || {
            format!("waiter {i} timed out early: {took} ns of {dur:?}")
        })?;
        ensure(timed_out || took < 5_000_000_000, || {
            format!("notified waiter {i} waited {took} ns")
        })?;
    }

    // 4. Notifications racing deadlines: every token produced is consumed exactly once.
    const TOKENS: u64 = 2_000;
    let q = Arc::new((Mutex::new((0u64, 0u64)), Condvar::new()));
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let (m, cv) = &*q;
                let (mut got, mut timeouts) = (0u64, 0u64);
                let mut g = m.lock().unwrap();
                loop {
                    if g.0 > 0 {
                        g.0 -= 1;
                        got += 1;
                        continue;
                    }
                    if g.1 == TOKENS {
                        return (got, timeouts);
                    }
                    let (g2, r) = cv.wait_timeout(g, Duration::from_micros(80)).unwrap();
                    g = g2;
                    timeouts += u64::from(r.timed_out());
                }
            })
        })
        .collect();
    for i in 0..TOKENS {
        {
            let mut g = q.0.lock().unwrap();
            g.0 += 1;
            g.1 += 1;
        }
        q.1.notify_one();
        if i % 64 == 0 {
            thread::sleep(Duration::from_micros(100));
        } else {
            thread::yield_now();
        }
    }
    q.1.notify_all();
    let (mut got, mut timeouts) = (0, 0);
    for c in consumers {
        let (g, t) = c.join().unwrap();
        got += g;
        timeouts += t;
    }
    ensure(got == TOKENS, || {
        format!("{got} tokens consumed of {TOKENS}")
    })?;
    Ok(format!(
        "timeouts at most {} us late; notified after 1 ms of 200 ms in {} us; {} timed waiters; \
         {TOKENS} tokens with {timeouts} timeouts racing",
        late_max / 1000,
        took / 1000,
        2 * N
    ))
}
