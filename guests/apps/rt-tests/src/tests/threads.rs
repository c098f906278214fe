//! Spawning, joining, thread-locals and park/unpark.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::hint::black_box;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;

use activm_rt::rt;
use activm_rt::stats;
use activm_rt::sync::Arc;
use activm_rt::thread::{self, JoinHandle};

use crate::TestResult;

use super::{ensure, ms, ns_ticks};

pub(super) fn spawn_join_10000() -> TestResult {
    const N: u64 = 10_000;
    let before = stats::snapshot();
    let start = rt::rdtsc();
    let handles: Vec<JoinHandle<u64>> = (0..N).map(|i| thread::spawn(move || i * 2)).collect();
    let spawned = rt::rdtsc();
    let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let end = rt::rdtsc();
    ensure(sum == N * (N - 1), || {
        format!("sum of results {sum}, expected {}", N * (N - 1))
    })?;
    let after = stats::snapshot();
    ensure(after.slots_in_use == before.slots_in_use, || {
        format!(
            "stack slots in use {} -> {} (leak)",
            before.slots_in_use, after.slots_in_use
        )
    })?;
    ensure(after.heap_stacks == before.heap_stacks, || {
        format!(
            "heap stacks {} -> {} (leak)",
            before.heap_stacks, after.heap_stacks
        )
    })?;
    Ok(format!(
        "{N} threads: spawn {} ns each, all run and joined in {} ms",
        rt::ticks_to_ns(spawned - start) / N,
        ms(end - spawned)
    ))
}

pub(super) fn builder() -> TestResult {
    let main = thread::current();
    ensure(main.name() == Some("main"), || {
        format!("main thread is named {:?}", main.name())
    })?;
    let h = thread::Builder::new()
        .name("named-worker".into())
        .spawn(|| {
            let me = thread::current();
            (String::from(me.name().unwrap_or("")), me.id())
        })
        .unwrap();
    let handle_name = String::from(h.thread().name().unwrap_or(""));
    let handle_id = h.thread().id();
    let (name, id) = h.join().unwrap();
    ensure(name == "named-worker" && handle_name == name, || {
        format!("names {name:?} / {handle_name:?}")
    })?;
    ensure(id == handle_id && id != main.id(), || "thread ids".into())?;
    // A bigger-than-slot stack (from the heap) really is that big.
    let slot = activm_rt::stack::slot_usable();
    let big = thread::Builder::new()
        .stack_size(slot * 4)
        .spawn(move || {
            let buf = [7u8; 256 * 1024];
            black_box(&buf);
            buf.iter().map(|&b| u64::from(b)).sum::<u64>()
        })
        .unwrap()
        .join()
        .unwrap();
    ensure(big == 7 * 256 * 1024, || {
        format!("big-stack thread returned {big}")
    })?;
    let unnamed = thread::spawn(|| thread::current().name().map(String::from))
        .join()
        .unwrap();
    ensure(unnamed.is_none(), || "unnamed thread has a name".into())?;
    Ok(format!("names, ids, {} KiB heap stack", slot * 4 / 1024))
}

static TLS_DROPS: AtomicU64 = AtomicU64::new(0);

struct DropCounter;

impl Drop for DropCounter {
    fn drop(&mut self) {
        TLS_DROPS.fetch_add(1, Ordering::AcqRel);
    }
}

activm_rt::thread_local! {
    static TLS_ID: Cell<u64> = const { Cell::new(0) };
    static TLS_DROP: RefCell<Option<DropCounter>> = RefCell::new(None);
}

pub(super) fn thread_local() -> TestResult {
    const THREADS: u64 = 16;
    TLS_ID.set(12345);
    let drops_before = TLS_DROPS.load(Ordering::Acquire);
    let bad = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (1..=THREADS)
        .map(|id| {
            let bad = bad.clone();
            thread::spawn(move || {
                if TLS_ID.get() != 0 {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                TLS_ID.set(id);
                TLS_DROP.set(Some(DropCounter));
                for _ in 0..100 {
                    thread::yield_now();
                    if TLS_ID.get() != id {
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
        format!("{} wrong thread-local reads", bad.load(Ordering::Relaxed))
    })?;
    ensure(TLS_ID.get() == 12345, || "main's value changed".into())?;
    let drops = TLS_DROPS.load(Ordering::Acquire) - drops_before;
    ensure(drops == THREADS, || {
        format!("{drops} destructors ran, expected {THREADS}")
    })?;
    Ok(format!(
        "{THREADS} threads, values kept across yields, {drops} destructors"
    ))
}

pub(super) fn park_unpark() -> TestResult {
    let flag = Arc::new(AtomicBool::new(false));
    let t = {
        let flag = flag.clone();
        thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                thread::park();
            }
            true
        })
    };
    thread::sleep(Duration::from_millis(2));
    flag.store(true, Ordering::Release);
    t.thread().unpark();
    ensure(t.join().unwrap(), || "parked thread".into())?;
    // A token given before park makes park return at once: a rescuer unparks us after 2 s in
    // case park waited instead, and must not have been needed.
    thread::current().unpark();
    let rescued = Arc::new(AtomicBool::new(false));
    let rescuer = {
        let (main, rescued) = (thread::current(), rescued.clone());
        let done = flag.clone();
        done.store(false, Ordering::Release);
        thread::spawn(move || {
            let deadline = rt::rdtsc() + ns_ticks(2_000_000_000);
            while !done.load(Ordering::Acquire) && rt::rdtsc() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if !done.load(Ordering::Acquire) {
                rescued.store(true, Ordering::Release);
                main.unpark();
            }
        })
    };
    thread::park();
    flag.store(true, Ordering::Release);
    rescuer.join().unwrap();
    ensure(!rescued.load(Ordering::Acquire), || {
        "park waited although a token was there".into()
    })?;
    Ok("park/unpark and the token".into())
}
