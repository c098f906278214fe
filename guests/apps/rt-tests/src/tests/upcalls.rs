//! Upcalls through the simulated VMM, and activations on the real one.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use core::time::Duration;

use activm_rt::rt::{self, SpinLock};
use activm_rt::stats;
use activm_rt::sync::{Arc, Mutex};
use activm_rt::thread;
use activm_rt::upcall::{self, sim};
use activm_stub::protocol::shared::UpcallKind;

use crate::regs::RegState;
use crate::TestResult;

use super::{ensure, kind_count, wait_until};

pub(super) fn upcall_newproc() -> TestResult {
    let me = rt::vcpu();
    let before = kind_count(UpcallKind::NewProc);
    let (records_before, _, _) = upcall::record_stats();
    let seq = sim::post(me, UpcallKind::NewProc, sim::activation_of(me), me, 0, None);
    ensure(
        wait_until(Duration::from_secs(1), || {
            kind_count(UpcallKind::NewProc) > before
        }),
        || "NEWPROC record not handled".into(),
    )?;
    let (records, max_seq, seq_errors) = upcall::record_stats();
    ensure(
        records > records_before && max_seq >= seq && seq_errors == 0,
        || format!("records {records}, max seq {max_seq}, out of order {seq_errors}"),
    )?;
    Ok(format!("record seq {seq} handled on vCPU {me}"))
}

static USER_FROM: AtomicU32 = AtomicU32::new(u32::MAX);

pub(super) fn upcall_user() -> TestResult {
    upcall::set_user_hook(|from| USER_FROM.store(from, Ordering::Release));
    let me = rt::vcpu();
    let target = (me + 1) % rt::nr_vcpus();
    sim::post(
        target,
        UpcallKind::User,
        sim::activation_of(target),
        target,
        u64::from(me),
        None,
    );
    ensure(
        wait_until(Duration::from_secs(1), || {
            USER_FROM.load(Ordering::Acquire) == me
        }),
        || "USER hook not called".into(),
    )?;
    Ok(format!("USER from vCPU {me} handled on vCPU {target}"))
}

static SIGNO: AtomicU32 = AtomicU32::new(0);

pub(super) fn upcall_signal() -> TestResult {
    upcall::set_signal_handler(|signo| {
        let name = thread::current().name().map(String::from);
        if name.as_deref() == Some("signal") {
            SIGNO.store(signo, Ordering::Release);
        }
    });
    let me = rt::vcpu();
    sim::post(me, UpcallKind::Signal, sim::activation_of(me), me, 15, None);
    ensure(
        wait_until(Duration::from_secs(1), || {
            SIGNO.load(Ordering::Acquire) == 15
        }),
        || "signal handler thread did not run".into(),
    )?;
    Ok("SIGNAL 15 ran its handler in thread 'signal'".into())
}

/// Takes `victim` away with the simulated VMM (as a PREEMPTED record to this vCPU) `times`
/// times, each time waiting for the capture. Returns how many were in a restartable sequence.
fn capture_times(
    victim: &thread::Thread,
    times: u32,
    held: Option<bool>,
    until_rseq: bool,
) -> Result<u32, String> {
    let mut in_rseq = 0;
    let continued_before = stats::snapshot().continuations;
    for i in 0..times {
        let req = sim::request(
            sim::Capture::Preempt {
                deliver_to: rt::vcpu(),
            },
            Some(victim),
            held,
        );
        let done = wait_until(Duration::from_secs(10), || {
            if !req.is_done() {
                sim::kick_all();
            }
            req.is_done()
        });
        if !done {
            req.cancel();
            stats::dump();
            return Err(format!("capture {i} never happened"));
        }
        if held == Some(true) {
            // Let the continuation finish before the next capture (which could otherwise take
            // the holder again while it is being continued, replacing that continuation).
            let want = continued_before + u64::from(i) + 1;
            if !wait_until(Duration::from_secs(2), || {
                stats::snapshot().continuations >= want
            }) {
                stats::dump();
                return Err(format!("capture {i}: the lock holder was not continued"));
            }
        }
        if req.captured_in_rseq() {
            in_rseq += 1;
            if until_rseq {
                break;
            }
        }
    }
    Ok(in_rseq)
}

pub(super) fn upcall_preempted() -> TestResult {
    let stop = Arc::new(AtomicBool::new(false));
    let before = stats::snapshot();
    let victim = {
        let stop = stop.clone();
        thread::Builder::new()
            .name("victim".into())
            .spawn(move || -> Result<u64, String> {
                let mut st = RegState::new(99);
                let mut rounds = 0;
                while !stop.load(Ordering::Acquire) {
                    st.hold(20_000);
                    st.check().map_err(|e| format!("round {rounds}: {e}"))?;
                    rounds += 1;
                }
                Ok(rounds)
            })
            .unwrap()
    };
    let captures = capture_times(&victim.thread(), 5, Some(false), false)?;
    thread::sleep(Duration::from_millis(5));
    stop.store(true, Ordering::Release);
    let rounds = victim.join().unwrap()?;
    let after = stats::snapshot();
    let resumed = after.resumed_contexts - before.resumed_contexts;
    ensure(resumed >= 5, || format!("{resumed} contexts resumed"))?;
    Ok(format!(
        "victim taken away 5 times ({captures} inside a restartable sequence), resumed from its PREEMPTED records with registers intact over {rounds} rounds"
    ))
}

pub(super) fn upcall_preempted_rseq() -> TestResult {
    let stop = Arc::new(AtomicBool::new(false));
    let probe_before = rt::probe_total();
    let before = stats::snapshot();
    let victim = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut calls = 0u64;
            while !stop.load(Ordering::Acquire) {
                rt::probe_increment(100);
                calls += 1;
            }
            calls
        })
    };
    let hits = capture_times(&victim.thread(), 20, Some(false), true)?;
    stop.store(true, Ordering::Release);
    let calls = victim.join().unwrap();
    let after = stats::snapshot();
    let probe = rt::probe_total() - probe_before;
    ensure(hits > 0, || {
        "no capture landed inside the restartable sequence".into()
    })?;
    ensure(probe == calls, || {
        format!("probe counter {probe}, {calls} calls completed")
    })?;
    Ok(format!(
        "a PREEMPTED context inside the sequence was rewound ({} rewinds in all); counter exact over {calls} calls",
        after.rseq_rewinds - before.rseq_rewinds
    ))
}

pub(super) fn upcall_continuation() -> TestResult {
    static LOCK: SpinLock<u64> = SpinLock::new(0);
    *LOCK.lock() = 0;
    let stop = Arc::new(AtomicBool::new(false));
    let before = stats::snapshot();
    // `backoff`: spins outside the lock after each release, so that a test-and-test-and-set
    // spinlock does not starve the other thread under host overcommit.
    let spawn_locker = |stop: Arc<AtomicBool>, backoff: u32| {
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                let mut g = LOCK.lock();
                for _ in 0..2_000 {
                    core::hint::spin_loop();
                }
                *g += 1;
                drop(g);
                n += 1;
                for _ in 0..backoff {
                    core::hint::spin_loop();
                }
            }
            n
        })
    };
    let victim = spawn_locker(stop.clone(), 0);
    // A second thread contends for the same lock.
    let other = spawn_locker(stop.clone(), 20_000);
    capture_times(&victim.thread(), 3, Some(true), false)?;
    thread::sleep(Duration::from_millis(5));
    stop.store(true, Ordering::Release);
    let n = victim.join().unwrap() + other.join().unwrap();
    let after = stats::snapshot();
    let value = *LOCK.lock();
    let continued = after.continuations - before.continuations;
    ensure(continued >= 3, || {
        format!("{continued} lock holders continued")
    })?;
    ensure(value == n, || {
        format!("lock-protected counter {value}, {n} increments")
    })?;
    Ok(format!(
        "a spinlock holder taken away 3 times was continued to its release each time; counter exact ({n})"
    ))
}

pub(super) fn upcall_blocked() -> TestResult {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    COUNT.store(0, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let victim = {
        let stop = stop.clone();
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                COUNT.fetch_add(1, Ordering::Relaxed);
                for _ in 0..100 {
                    core::hint::spin_loop();
                }
            }
        })
    };
    let blocked_before = kind_count(UpcallKind::Blocked);
    let req = sim::request(sim::Capture::Block, Some(&victim.thread()), Some(false));
    let done = wait_until(Duration::from_secs(2), || {
        if !req.is_done() {
            sim::kick_all();
        }
        req.is_done()
    });
    if !done {
        req.cancel();
        return Err("the victim was never taken".into());
    }
    ensure(
        wait_until(Duration::from_secs(1), || {
            kind_count(UpcallKind::Blocked) > blocked_before
        }),
        || "BLOCKED not handled".into(),
    )?;
    let frozen = COUNT.load(Ordering::Acquire);
    // Other threads keep running while it is blocked.
    let other = thread::spawn(|| 42).join().unwrap();
    thread::sleep(Duration::from_millis(20));
    let still = COUNT.load(Ordering::Acquire);
    ensure(still == frozen && other == 42, || {
        format!("blocked thread ran meanwhile ({frozen} -> {still})")
    })?;
    let unblocked_before = kind_count(UpcallKind::Unblocked);
    req.unblock(rt::vcpu());
    ensure(
        wait_until(Duration::from_secs(1), || {
            COUNT.load(Ordering::Acquire) > still
        }),
        || "the thread did not resume after UNBLOCKED".into(),
    )?;
    ensure(kind_count(UpcallKind::Unblocked) > unblocked_before, || {
        "UNBLOCKED not counted".into()
    })?;
    stop.store(true, Ordering::Release);
    victim.join().unwrap();
    Ok(format!(
        "blocked on activation {} (others ran), resumed from its UNBLOCKED record",
        req.activation()
    ))
}

/// How many processors the VMM grants this guest when all its vCPUs have work: spinning threads
/// keep every vCPU busy (an idle one gives its processor back) while the guest asks for all of
/// them, for up to 300 ms.
fn processors_on_offer() -> u32 {
    let n = rt::nr_vcpus();
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..n)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    core::hint::spin_loop();
                }
            })
        })
        .collect();
    let deadline = rt::rdtsc() + 300 * rt::tsc_khz();
    let mut most = 0;
    while rt::rdtsc() < deadline && most < n {
        upcall::set_concurrency(n);
        most = most.max(upcall::granted_vcpus());
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Release);
    for s in spinners {
        let _ = s.join();
    }
    most
}

/// The VMM's real activations: processors taken away and given back while threads work.
pub(super) fn sa_real() -> TestResult {
    stats::set_watchdog(Some(Duration::from_secs(30)));
    let r = sa_real_inner();
    stats::set_watchdog(None);
    r
}

fn sa_real_inner() -> TestResult {
    static M: Mutex<u64> = Mutex::new(0);
    *M.lock().unwrap() = 0;
    let n = rt::nr_vcpus();
    let granted = processors_on_offer();
    if granted < 2 {
        return Err(format!(
            "skipped: the VMM grants {granted} processor(s), nothing to take away (--pcpus 2 or more)"
        ));
    }
    let before = stats::snapshot();
    let preempted_before = kind_count(UpcallKind::Preempted);
    let newproc_before = kind_count(UpcallKind::NewProc);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2 * n as u64)
        .map(|seed| {
            let stop = stop.clone();
            thread::spawn(move || -> Result<u64, String> {
                let mut st = RegState::new(seed + 7);
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    for _ in 0..100 {
                        *M.lock().unwrap() += 1;
                    }
                    n += 100;
                    st.hold(10_000);
                    st.check()?;
                }
                Ok(n)
            })
        })
        .collect();
    for _ in 0..8 {
        thread::sleep(Duration::from_millis(30));
        upcall::set_concurrency(1);
        thread::sleep(Duration::from_millis(30));
        upcall::set_concurrency(n);
    }
    thread::sleep(Duration::from_millis(30));
    stop.store(true, Ordering::Release);
    let mut total = 0;
    for w in workers {
        total += w.join().unwrap()?;
    }
    let after = stats::snapshot();
    let m = *M.lock().unwrap();
    ensure(m == total, || {
        format!("mutex counter {m}, expected {total}")
    })?;
    let preempted = kind_count(UpcallKind::Preempted) - preempted_before;
    let newproc = kind_count(UpcallKind::NewProc) - newproc_before;
    // Taking processors away must hand threads over; giving them back may start new
    // activations or resume vCPUs the VMM had descheduled in place (its policy, not ours).
    ensure(preempted > 0, || {
        format!("{preempted} PREEMPTED and {newproc} NEWPROC records")
    })?;
    Ok(format!(
        "{preempted} PREEMPTED, {newproc} NEWPROC; {} contexts resumed, {} idle ones dropped, {} adopted, {} continued; counter exact ({total})",
        after.resumed_contexts - before.resumed_contexts,
        after.dropped_idle_contexts - before.dropped_idle_contexts,
        after.adoptions - before.adoptions,
        after.continuations - before.continuations,
    ))
}

/// The stress test while the VMM's allocation changes at random.
pub(super) fn sa_chaos() -> TestResult {
    let granted = processors_on_offer();
    if granted < 2 {
        return Err(format!(
            "skipped: the VMM grants {granted} processor(s), nothing to take away (--pcpus 2 or more)"
        ));
    }
    // Longer than the workload's own limit, so that a slow run ends with the workload's
    // verdict, not the watchdog's: on a host where an interrupt takes ~120 us to reach the
    // guest and the load average is ~30, 5,000 random preemptions took 20-25 s.
    let limit = Duration::from_millis(super::sched::STRESS_LIMIT_MS);
    stats::set_watchdog(Some(limit + Duration::from_secs(15)));
    let r = super::sched::stress(true);
    stats::set_watchdog(None);
    r
}

/// Refilling the upcall stack pool never waits for its produce lock: the holder may be a
/// scheduler context the VMM took, queued for adoption behind the refilling scheduler (the
/// six-guest soak's run 147 spun 40 s there). Before the fix this spun until the watchdog.
pub(super) fn refill_busy() -> TestResult {
    upcall::refill_pool_beside_a_producer();
    Ok(String::from(
        "a refill beside a holder of the produce lock returned",
    ))
}
