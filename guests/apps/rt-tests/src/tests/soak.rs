//! `chaos-soak SECONDS`: a mixed workload, then every invariant.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;

use activm_rt::rt::{self, SpinLock};
use activm_rt::stats;
use activm_rt::sync::mpsc;
use activm_rt::sync::{Arc, Condvar, Mutex};
use activm_rt::thread;
use activm_rt::upcall;
use activm_stub::protocol::shared::UpcallKind;

use super::{ensure, ms};

/// `chaos-soak SECONDS` (see main.rs): a mixed workload for `seconds`, then every invariant.
pub fn chaos_soak(seconds: u64) -> Result<String, String> {
    use activm_rt::blk;
    static M: Mutex<u64> = Mutex::new(0);
    static SPIN: SpinLock<u64> = SpinLock::new(0);
    static STOP: AtomicBool = AtomicBool::new(false);
    static CHILDREN_RAN: AtomicU64 = AtomicU64::new(0);
    static EARLY_WAKEUPS: AtomicU64 = AtomicU64::new(0);
    // Past the soak itself, 30 s for the joins and checks.
    stats::set_watchdog(Some(Duration::from_secs(seconds + 30)));
    let n = u64::from(rt::nr_vcpus());
    let before = stats::snapshot();
    // Bounded: a collector starved by the chaos makes senders wait, not the heap grow.
    let (tx, rx) = mpsc::sync_channel::<u64>(4096);
    let collector = thread::spawn(move || rx.iter().count() as u64);
    // Counters under a mutex and a spinlock, spawns and joins, messages.
    let workers: Vec<_> = (0..2 * n)
        .map(|w| {
            let tx = tx.clone();
            thread::spawn(move || {
                let (mut iters, mut children, mut sent) = (0u64, 0u64, 0u64);
                while !STOP.load(Ordering::Acquire) {
                    *M.lock().unwrap() += 1;
                    *SPIN.lock() += 1;
                    if iters % 64 == w % 64 {
                        thread::spawn(|| {
                            CHILDREN_RAN.fetch_add(1, Ordering::AcqRel);
                        })
                        .join()
                        .unwrap();
                        children += 1;
                    }
                    if iters % 8 == 0 {
                        tx.send(iters).unwrap();
                        sent += 1;
                    }
                    iters += 1;
                }
                (iters, children, sent)
            })
        })
        .collect();
    drop(tx);
    // Condvar ping-pong pairs: each side counts its turns; they must match exactly.
    let pairs: Vec<_> = (0..2)
        .map(|_| {
            let shared = Arc::new((Mutex::new((0u64, false)), Condvar::new()));
            let other = shared.clone();
            let pong = thread::spawn(move || {
                let (lock, cv) = &*other;
                let mut turns = 0u64;
                let mut state = lock.lock().unwrap();
                loop {
                    while !state.1 && !STOP.load(Ordering::Acquire) {
                        state = cv.wait(state).unwrap();
                    }
                    if !state.1 {
                        return turns;
                    }
                    state.0 += 1;
                    state.1 = false;
                    turns += 1;
                    cv.notify_one();
                }
            });
            let ping = thread::spawn(move || {
                let (lock, cv) = &*shared;
                let mut turns = 0u64;
                let mut state = lock.lock().unwrap();
                while !STOP.load(Ordering::Acquire) {
                    state.1 = true;
                    turns += 1;
                    cv.notify_one();
                    while state.1 {
                        state = cv.wait(state).unwrap();
                    }
                }
                // Let the pong side see the end.
                drop(state);
                cv.notify_all();
                (turns, shared)
            });
            (ping, pong)
        })
        .collect();
    // Sleepers: 0.1-2 ms sleeps, never woken early.
    let sleepers: Vec<_> = (0..n)
        .map(|s| {
            thread::spawn(move || {
                let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (s << 32);
                let mut slept = 0u64;
                while !STOP.load(Ordering::Acquire) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let us = 100 + rng % 1900;
                    let t = rt::rdtsc();
                    thread::sleep(Duration::from_micros(us));
                    if rt::ticks_to_ns(rt::rdtsc() - t) < us * 1000 {
                        EARLY_WAKEUPS.fetch_add(1, Ordering::Relaxed);
                    }
                    slept += 1;
                }
                slept
            })
        })
        .collect();
    // Disk I/O, if there is a disk: write, read back, compare.
    let disk = (blk::capacity() >= 2048 && !blk::read_only()).then(|| {
        thread::spawn(|| -> Result<u64, String> {
            let mut ops = 0u64;
            let mut buf = alloc::vec![0u8; 512];
            let mut back = alloc::vec![0u8; 512];
            while !STOP.load(Ordering::Acquire) {
                let sector = 1024 + ops % 1024;
                for (o, b) in buf.iter_mut().enumerate() {
                    *b = (ops as usize ^ o) as u8;
                }
                blk::write(sector, &buf).map_err(|e| format!("write: {e}"))?;
                blk::read(sector, &mut back).map_err(|e| format!("read: {e}"))?;
                if back != buf {
                    return Err(format!(
                        "sector {sector} read back differs after write {ops}"
                    ));
                }
                ops += 1;
            }
            Ok(ops)
        })
    });
    // Run, watching for progress.
    let start = rt::rdtsc();
    let mut last = (0u64, start);
    while ms(rt::rdtsc() - start) < seconds * 1000 {
        thread::sleep(Duration::from_millis(100));
        let done = *M.lock().unwrap();
        let now = rt::rdtsc();
        if done != last.0 {
            last = (done, now);
        } else if ms(now - last.1) > 10_000 {
            return Err(format!(
                "no progress for 10 s after {done} increments (deadlock?)"
            ));
        }
    }
    STOP.store(true, Ordering::Release);
    let (mut iters, mut children, mut sent) = (0, 0, 0);
    for w in workers {
        let (i, c, s) = w.join().unwrap();
        iters += i;
        children += c;
        sent += s;
    }
    let received = collector.join().unwrap();
    let mut exchanges = 0;
    for (ping, pong) in pairs {
        let (pings, shared) = ping.join().unwrap();
        let pongs = pong.join().unwrap();
        let counted = shared.0.lock().unwrap().0;
        ensure(
            pongs == counted && (pings == pongs || pings == pongs + 1),
            || format!("condvar ping-pong: {pings} pings, {pongs} pongs, {counted} counted"),
        )?;
        exchanges += pongs;
    }
    let mut slept = 0;
    for s in sleepers {
        slept += s.join().unwrap();
    }
    let disk_ops = match disk {
        Some(d) => d.join().unwrap()?,
        None => 0,
    };
    stats::set_watchdog(None);
    // Every record handled: none left in the retry list once things settle.
    for _ in 0..20 {
        if upcall::records_waiting() == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let waiting = upcall::records_waiting();
    if waiting != 0 {
        upcall::print_waiting_records();
    }
    ensure(waiting == 0, || {
        format!("{waiting} upcall records never handled")
    })?;
    let m = *M.lock().unwrap();
    let spin = *SPIN.lock();
    ensure(m == iters && spin == iters, || {
        format!("mutex counter {m}, spinlock counter {spin}, expected {iters}")
    })?;
    let ran = CHILDREN_RAN.load(Ordering::Acquire);
    ensure(ran == children, || {
        format!("{ran} children ran, {children} joined")
    })?;
    ensure(received == sent, || {
        format!("{received} messages received, {sent} sent")
    })?;
    let early = EARLY_WAKEUPS.load(Ordering::Relaxed);
    ensure(early == 0, || format!("{early} sleeps woke early"))?;
    ensure(exchanges > 0 && slept > 0, || {
        "no ping-pong or no sleep completed".into()
    })?;
    let after = stats::snapshot();
    let kind =
        |k: UpcallKind| after.records_by_kind[k as usize] - before.records_by_kind[k as usize];
    Ok(format!(
        "{seconds} s: {iters} increments exact, {children} children, {received} messages, {exchanges} ping-pongs, {slept} sleeps (none early), {disk_ops} disk write+read pairs verified; records: {} PREEMPTED, {} NEWPROC, {} BLOCKED, {} UNBLOCKED; {} contexts resumed, {} idle yields",
        kind(UpcallKind::Preempted),
        kind(UpcallKind::NewProc),
        kind(UpcallKind::Blocked),
        kind(UpcallKind::Unblocked),
        after.resumed_contexts - before.resumed_contexts,
        after.idle_yields - before.idle_yields,
    ))
}
