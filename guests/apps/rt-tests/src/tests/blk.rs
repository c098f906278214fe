//! The block device, and processors given back while threads wait.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::hint::black_box;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use core::time::Duration;

use activm_rt::rt;
use activm_rt::stats;
use activm_rt::sync::Arc;
use activm_rt::thread;
use activm_rt::upcall;
use activm_stub::protocol::shared::UpcallKind;

use crate::TestResult;

use super::{ensure, kind_count, ms};

/// The byte stored at `offset` of sector `sector` by the block tests.
fn blk_pattern(sector: u64, offset: usize) -> u8 {
    (sector.wrapping_mul(31) as usize ^ offset.wrapping_mul(7)) as u8
}

/// Threads write distinct sectors, read them back (in pieces and in multi-request spans), and
/// every device error comes back as an error.
pub(super) fn blk() -> TestResult {
    use activm_rt::blk::{self, Error, SECTOR_SIZE};
    let sectors = blk::capacity();
    ensure(sectors >= 2048, || {
        format!("the disk has {sectors} sectors; give it 1 MiB")
    })?;
    if blk::read_only() {
        return Err("skipped: the disk is read-only".into());
    }
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 64;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            thread::spawn(move || -> Result<(), String> {
                let mut buf = alloc::vec![0u8; SECTOR_SIZE as usize];
                for i in 0..PER_THREAD {
                    let sector = t * PER_THREAD + i;
                    for (o, b) in buf.iter_mut().enumerate() {
                        *b = blk_pattern(sector, o);
                    }
                    blk::write(sector, &buf).map_err(|e| format!("write {sector}: {e}"))?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap()?;
    }
    blk::flush().map_err(|e| format!("flush: {e}"))?;
    // One read spanning several requests (BLK_MAX_SECTORS each).
    let total = THREADS * PER_THREAD;
    let mut all = alloc::vec![0u8; (total * SECTOR_SIZE) as usize];
    blk::read(0, &mut all).map_err(|e| format!("read: {e}"))?;
    for sector in 0..total {
        for o in 0..SECTOR_SIZE as usize {
            let got = all[(sector * SECTOR_SIZE) as usize + o];
            ensure(got == blk_pattern(sector, o), || {
                format!(
                    "sector {sector} byte {o}: {got:#x}, expected {:#x}",
                    blk_pattern(sector, o)
                )
            })?;
        }
    }
    let mut one = [0u8; 512];
    ensure(
        blk::read(sectors, &mut one) == Err(Error::OutOfRange),
        || "a read past the end did not fail with OutOfRange".into(),
    )?;
    ensure(
        blk::read(sectors - 1, &mut [0u8; 1024]) == Err(Error::OutOfRange),
        || "a read straddling the end did not fail".into(),
    )?;
    ensure(
        blk::read(0, &mut [0u8; 100]) == Err(Error::BadLength),
        || "a partial-sector buffer was accepted".into(),
    )?;
    Ok(format!(
        "{total} sectors written by {THREADS} threads, read back exact; errors reported"
    ))
}

/// Threads wait for a slow device (`--io-latency`) while others compute: the computing threads
/// must keep running. With activations every blocking request is a BLOCKED then UNBLOCKED
/// upcall, and the blocked thread resumes with the request's result.
pub(super) fn blk_overlap() -> TestResult {
    stats::set_watchdog(Some(Duration::from_secs(20)));
    let r = blk_overlap_inner();
    stats::set_watchdog(None);
    r
}

fn blk_overlap_inner() -> TestResult {
    use activm_rt::blk::{self, SECTOR_SIZE};
    const READERS: u64 = 4;
    const READS: u64 = 10;
    let sa = upcall::activations_enabled();
    let blocked_before = kind_count(UpcallKind::Blocked);
    let unblocked_before = kind_count(UpcallKind::Unblocked);
    // Known contents (sectors 4096.. so `blk` may run before or after).
    let base = 4096;
    ensure(blk::capacity() >= base + READERS * READS, || {
        "the disk is too small".into()
    })?;
    let mut buf = alloc::vec![0u8; SECTOR_SIZE as usize];
    for i in 0..READERS * READS {
        for (o, b) in buf.iter_mut().enumerate() {
            *b = blk_pattern(base + i, o);
        }
        blk::write(base + i, &buf).map_err(|e| format!("write: {e}"))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let computed = Arc::new(AtomicU64::new(0));
    let computers: Vec<_> = (0..rt::nr_vcpus())
        .map(|_| {
            let (stop, computed) = (stop.clone(), computed.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    black_box((0..1000u64).fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b)));
                    computed.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = rt::rdtsc();
    // Reads during which the computers made progress: the real overlap.
    let overlapped = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (computed, overlapped) = (computed.clone(), overlapped.clone());
            thread::spawn(move || -> Result<(u64, u64), String> {
                let mut buf = alloc::vec![0u8; SECTOR_SIZE as usize];
                let (mut waited, mut fastest) = (0, u64::MAX);
                for i in 0..READS {
                    let sector = base + r * READS + i;
                    let t = rt::rdtsc();
                    let before = computed.load(Ordering::Acquire);
                    blk::read(sector, &mut buf).map_err(|e| format!("read {sector}: {e}"))?;
                    if computed.load(Ordering::Acquire) > before {
                        overlapped.fetch_add(1, Ordering::Relaxed);
                    }
                    let took = rt::rdtsc() - t;
                    waited += took;
                    fastest = fastest.min(took);
                    for (o, b) in buf.iter().enumerate() {
                        if *b != blk_pattern(sector, o) {
                            return Err(format!("sector {sector} byte {o} wrong after the read"));
                        }
                    }
                }
                Ok((waited, fastest))
            })
        })
        .collect();
    let (mut waited, mut fastest) = (0, u64::MAX);
    for r in readers {
        let (w, f) = r.join().unwrap()?;
        waited += w;
        fastest = fastest.min(f);
    }
    let elapsed = rt::rdtsc() - start;
    let during = computed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Release);
    for c in computers {
        c.join().unwrap();
    }
    let per_read_us = rt::ticks_to_ns(waited) / 1000 / (READERS * READS);
    // The device is slow if even its fastest read took long: a loaded host stretches the mean
    // of a fast device's reads past any bound (a 20 us device averaged over 500 us at a load
    // average of 4), never every one of them.
    let slow = rt::ticks_to_ns(fastest) / 1000 >= 500;
    let blocked = kind_count(UpcallKind::Blocked) - blocked_before;
    let unblocked = kind_count(UpcallKind::Unblocked) - unblocked_before;
    ensure(during > 0, || {
        "no computation ran while the readers waited".into()
    })?;
    let overlapped = overlapped.load(Ordering::Relaxed);
    if slow {
        // A slow device: computation went on while reads were in flight. With activations
        // every blocked read frees its processor for a computer (how many reads see it depends
        // on the processors the guest holds beside other guests: 11 of 40 with 3 vCPUs beside
        // an oblivious guest on 2 processors, 40 of 40 alone); an oblivious vCPU blocks with
        // its reader, and an asynchronous read parks only its thread, so only reads that left
        // another vCPU free (or any read, asynchronous) overlap.
        let want = if sa && !blk::asynchronous() {
            READERS
        } else {
            1
        };
        ensure(overlapped >= want, || {
            format!(
                "computation went on during only {overlapped} of {} slow reads (want {want})",
                READERS * READS
            )
        })?;
    }
    if blk::asynchronous() {
        // Submitted without blocking: the thread parks in the runtime, the vCPU goes on.
        ensure(blocked == 0 && unblocked == 0, || {
            format!("asynchronous reads but {blocked} BLOCKED and {unblocked} UNBLOCKED records")
        })?;
    } else if sa && slow {
        // A slow device: every read blocked its vCPU in the VMM.
        ensure(
            blocked >= READERS * READS && unblocked >= READERS * READS,
            || {
                format!(
                    "{} slow reads but {blocked} BLOCKED and {unblocked} UNBLOCKED records",
                    READERS * READS
                )
            },
        )?;
    }
    Ok(format!(
        "{} {} reads of {per_read_us} us each (fastest {} us) in {} ms; {during} units computed meanwhile, during {overlapped} reads; {blocked} BLOCKED, {unblocked} UNBLOCKED",
        READERS * READS,
        if blk::asynchronous() { "asynchronous" } else { "blocking" },
        rt::ticks_to_ns(fastest) / 1000,
        ms(elapsed)
    ))
}

/// Idle vCPUs give their processors back to the VMM (`sa_yield`) and the guest gets them back
/// when work appears (`sa_setconcurrency`), several times over, with nothing lost.
pub(super) fn idle_yield() -> TestResult {
    let n = rt::nr_vcpus();
    let before = stats::snapshot();
    let mut lowest = n;
    let mut regained = 0;
    for round in 0..5u64 {
        // Only this thread runs, nobody sleeps: the other vCPUs idle, halt, then yield.
        let start = rt::rdtsc();
        while rt::ticks_to_ns(rt::rdtsc() - start) < 30_000_000 {
            lowest = lowest.min(upcall::granted_vcpus());
            if upcall::granted_vcpus() == 1 {
                break;
            }
            core::hint::spin_loop();
        }
        // Work for every vCPU: the guest asks for its processors again. The workers run for
        // 20 ms, and on until a second processor came back (2 s at most): on a loaded host a
        // granted vCPU's thread can wait longer than 20 ms to be scheduled.
        let done = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let workers: Vec<_> = (0..2 * n as u64)
            .map(|i| {
                let (done, most) = (done.clone(), most.clone());
                thread::spawn(move || {
                    let start = rt::rdtsc();
                    let mut x = i + round;
                    loop {
                        let ran = rt::ticks_to_ns(rt::rdtsc() - start);
                        let granted = upcall::granted_vcpus();
                        most.fetch_max(granted, Ordering::Relaxed);
                        if ran >= 2_000_000_000 || (ran >= 20_000_000 && granted >= 2) {
                            break;
                        }
                        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    x
                })
            })
            .collect();
        let start = rt::rdtsc();
        while done.load(Ordering::Relaxed) < 2 * u64::from(n) {
            most.fetch_max(upcall::granted_vcpus(), Ordering::Relaxed);
            thread::yield_now();
            if rt::ticks_to_ns(rt::rdtsc() - start) > 5_000_000_000 {
                return Err("workers did not finish within 5 s".into());
            }
        }
        for w in workers {
            w.join().unwrap();
        }
        if most.load(Ordering::Relaxed) >= 2 {
            regained += 1;
        }
    }
    let after = stats::snapshot();
    let yields = after.idle_yields - before.idle_yields;
    ensure(yields > 0 && lowest == 1, || {
        format!("{yields} idle yields, at least {lowest} vCPUs kept running while idle")
    })?;
    ensure(regained == 5, || {
        format!("the guest got more than one processor back in only {regained} of 5 rounds")
    })?;
    Ok(format!(
        "{yields} processors given back idle, regained in 5 of 5 rounds; {} activations",
        after.activations - before.activations
    ))
}
