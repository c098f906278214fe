//! I/O overlap workload, for `cargo xtask bench io`:
//!
//! * `serve THREADS REQUESTS WORK [LOCKED]`: THREADS threads serve REQUESTS requests in total; a
//!   request reads 4 KiB from a pseudo-random place on the disk (`activm run --disk`, slowed down
//!   with `--io-latency`), hashes it WORK times (pure computation), then updates a shared table
//!   under one mutex, hashing 256 bytes LOCKED times inside the critical section (default 0: no
//!   lock). While one thread waits for the device the others should keep the processors busy.
//! * `serve-cpu THREADS REQUESTS WORK [LOCKED]`: the same without the reads (the computation
//!   alone).
//! * `latency READS`: one thread reads 4 KiB READS times; the mean time of one read.
//! * `storm THREADS ROUNDS`: a flush storm, the I/O-heavy neighbour of `docs/activations.md`:
//!   THREADS threads each write 4 KiB to a place of their own and flush, ROUNDS times, then read
//!   every place back; `check=` is the number of places that hold their last round's data.
//! * `serve-latency THREADS REQUESTS INTERVAL_US WORK`: a server with open-loop arrivals:
//!   request i arrives at start + i * INTERVAL_US; THREADS threads take them in turn, each
//!   sleeping (a timer) until its request arrives, then reading 4 KiB from the disk if there is
//!   one (blocking on the device) and hashing it WORK times. A request's latency runs from its
//!   arrival to the end of its computation, measured with the TSC. Also prints
//!   `CDF us=q0,q1,...,q100` (the latency at each whole percentile).
//! * `exact THREADS READS LATENCY_US WORK`: a check, not a benchmark: THREADS threads each write
//!   a 4 KiB block of their own, then read it back (READS reads in all), hashing it WORK times
//!   between reads. Every read must return the block and take at least LATENCY_US (the
//!   device's `--io-latency`: a completion is never early); `early=` and `bad=` count the ones
//!   that did not, and the exit status is 1 if any did.
//!
//! Each prints one `RESULT name ms=... check=...` line and exits 0.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use activm_rt::blk;
use activm_rt::sync::Mutex;
use activm_rt::thread;
use activm_stub::{println, rdtsc, tsc_khz};

activm_rt::main!(main);

fn main(args: &[&str]) -> i32 {
    let number =
        |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    match args.first().copied() {
        Some("serve") => serve(
            number(1, 16),
            number(2, 400),
            number(3, 100),
            number(4, 0),
            true,
        ),
        Some("serve-cpu") => serve(
            number(1, 16),
            number(2, 400),
            number(3, 100),
            number(4, 0),
            false,
        ),
        Some("latency") => latency(number(1, 100)),
        Some("storm") => storm(number(1, 8), number(2, 200)),
        Some("exact") => exact(number(1, 8), number(2, 200), number(3, 1000), number(4, 20)),
        Some("serve-latency") => serve_latency(
            number(1, 8),
            number(2, 1000),
            number(3, 1000),
            number(4, 20),
        ),
        _ => {
            println!("usage: serve THREADS REQUESTS WORK | serve-cpu THREADS REQUESTS WORK | latency READS | serve-latency THREADS REQUESTS INTERVAL_US WORK | storm THREADS ROUNDS | exact THREADS READS LATENCY_US WORK");
            2
        }
    }
}

fn elapsed_ms(start: u64) -> f64 {
    (rdtsc() - start) as f64 / tsc_khz() as f64
}

/// Sectors per request (4 KiB).
const SECTORS: u64 = 8;

/// Where request `i` reads: spread over the disk, 4 KiB aligned.
fn place(i: u64, disk_sectors: u64) -> u64 {
    let slots = (disk_sectors / SECTORS).max(1);
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17) % slots * SECTORS
}

/// FNV-1a over `buf`, `rounds` times, chained.
fn hash(buf: &[u8], rounds: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for r in 0..rounds {
        h ^= r;
        for &b in buf {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The shared table the requests update under one lock.
static TABLE: Mutex<[u64; 32]> = Mutex::new([0; 32]);

fn serve(threads: u64, requests: u64, work: u64, locked: u64, io: bool) -> i32 {
    let disk_sectors = blk::capacity();
    if io && disk_sectors < SECTORS {
        println!("iobench: serve needs a disk (activm run --disk IMAGE)");
        return 2;
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static CHECK: AtomicU64 = AtomicU64::new(0);
    NEXT.store(0, Ordering::Relaxed);
    CHECK.store(0, Ordering::Relaxed);
    let start = rdtsc();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            thread::spawn(move || {
                let mut buf = alloc::vec![0u8; (SECTORS * blk::SECTOR_SIZE) as usize];
                loop {
                    let i = NEXT.fetch_add(1, Ordering::Relaxed);
                    if i >= requests {
                        break;
                    }
                    if io {
                        blk::read(place(i, disk_sectors), &mut buf).expect("disk read");
                    } else {
                        buf[0] = i as u8;
                    }
                    let h = hash(&buf, work);
                    if locked > 0 {
                        let mut table = TABLE.lock().unwrap();
                        let slot = (h % 32) as usize;
                        table[slot] = table[slot].wrapping_add(hash(&buf[..256], locked) | 1);
                    }
                    CHECK.fetch_add(h & 0xffff, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let ms = elapsed_ms(start);
    let updates = TABLE.lock().unwrap().iter().filter(|&&v| v != 0).count();
    println!(
        "RESULT {} ms={ms:.2} requests={requests} check={} table_slots={updates}",
        if io { "serve" } else { "serve-cpu" },
        CHECK.load(Ordering::Relaxed)
    );
    0
}

fn latency(reads: u64) -> i32 {
    let disk_sectors = blk::capacity();
    if disk_sectors < SECTORS {
        println!("iobench: latency needs a disk (activm run --disk IMAGE)");
        return 2;
    }
    let mut buf = alloc::vec![0u8; (SECTORS * blk::SECTOR_SIZE) as usize];
    let start = rdtsc();
    for i in 0..reads {
        blk::read(place(i, disk_sectors), &mut buf).expect("disk read");
    }
    let ms = elapsed_ms(start);
    println!(
        "RESULT latency ms={ms:.2} per_read_us={:.1} check={}",
        ms * 1000.0 / reads as f64,
        hash(&buf, 1)
    );
    0
}

fn serve_latency(threads: u64, requests: u64, interval_us: u64, work: u64) -> i32 {
    let threads = threads.max(1);
    let disk_sectors = blk::capacity();
    let khz = tsc_khz();
    let interval = interval_us * khz / 1000;
    // The first arrival 20 ms from now, once every thread has started and waits.
    let start = rdtsc() + 20 * khz;
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            thread::spawn(move || {
                let mut buf = alloc::vec![0u8; (SECTORS * blk::SECTOR_SIZE) as usize];
                let mut latencies = Vec::new();
                let mut check = 0u64;
                for i in (t..requests).step_by(threads as usize) {
                    let arrival = start + i * interval;
                    let now = rdtsc();
                    if now < arrival {
                        let ns = (arrival - now) * 1_000_000 / khz;
                        thread::sleep(core::time::Duration::from_nanos(ns));
                    }
                    if disk_sectors >= SECTORS {
                        blk::read(place(i, disk_sectors), &mut buf).expect("disk read");
                    } else {
                        buf[0] = i as u8;
                    }
                    check = check.wrapping_add(hash(&buf, work) & 0xffff);
                    latencies.push(rdtsc().saturating_sub(arrival));
                }
                (latencies, check)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut check = 0u64;
    for w in workers {
        let (latencies, c) = w.join().unwrap();
        all.extend(latencies);
        check = check.wrapping_add(c);
    }
    let ms = elapsed_ms(start);
    all.sort_unstable();
    let us = |q: f64| {
        let at = ((all.len() - 1) as f64 * q + 0.5) as usize;
        all[at.min(all.len() - 1)] as f64 * 1000.0 / khz as f64
    };
    let mut cdf = alloc::string::String::new();
    for p in 0..=100 {
        let sep = if p == 0 { "" } else { "," };
        let _ =
            core::fmt::Write::write_fmt(&mut cdf, format_args!("{sep}{:.1}", us(p as f64 / 100.0)));
    }
    println!("CDF us={cdf}");
    println!(
        "RESULT serve-latency requests={} ms={ms:.2} p50_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1} check={check}",
        all.len(),
        us(0.5),
        us(0.99),
        us(0.999),
        us(1.0)
    );
    0
}

/// The 4 KiB block thread `t` writes in round `round`.
fn storm_block(t: u64, round: u64) -> Vec<u8> {
    let word = (t << 32 | round).to_le_bytes();
    word.iter()
        .copied()
        .cycle()
        .take((SECTORS * blk::SECTOR_SIZE) as usize)
        .collect()
}

fn storm(threads: u64, rounds: u64) -> i32 {
    let disk_sectors = blk::capacity();
    if disk_sectors < threads * SECTORS {
        println!("iobench: storm needs a disk of THREADS x 4 KiB (activm run --disk IMAGE)");
        return 2;
    }
    static FLUSHES: AtomicU64 = AtomicU64::new(0);
    let start = rdtsc();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            thread::spawn(move || {
                for round in 0..rounds {
                    blk::write(t * SECTORS, &storm_block(t, round)).expect("disk write");
                    blk::flush().expect("disk flush");
                    FLUSHES.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let ms = elapsed_ms(start);
    let mut buf = alloc::vec![0u8; (SECTORS * blk::SECTOR_SIZE) as usize];
    let intact = (0..threads)
        .filter(|&t| {
            blk::read(t * SECTORS, &mut buf).expect("disk read");
            rounds == 0 || buf == storm_block(t, rounds - 1)
        })
        .count();
    println!(
        "RESULT storm ms={ms:.2} flushes={} check={intact}",
        FLUSHES.load(Ordering::Relaxed)
    );
    if intact as u64 == threads {
        0
    } else {
        1
    }
}

fn exact(threads: u64, reads: u64, latency_us: u64, work: u64) -> i32 {
    if blk::capacity() < threads * SECTORS {
        println!("iobench: exact needs a disk of THREADS x 4 KiB (activm run --disk IMAGE)");
        return 2;
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static EARLY: AtomicU64 = AtomicU64::new(0);
    static BAD: AtomicU64 = AtomicU64::new(0);
    static DONE: AtomicU64 = AtomicU64::new(0);
    static FASTEST: AtomicU64 = AtomicU64::new(u64::MAX);
    let least = latency_us * tsc_khz() / 1000;
    let start = rdtsc();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            thread::spawn(move || {
                let block = storm_block(t, 7);
                blk::write(t * SECTORS, &block).expect("disk write");
                let mut buf = alloc::vec![0u8; block.len()];
                while NEXT.fetch_add(1, Ordering::Relaxed) < reads {
                    buf.fill(0);
                    let t0 = rdtsc();
                    blk::read(t * SECTORS, &mut buf).expect("disk read");
                    let took = rdtsc() - t0;
                    FASTEST.fetch_min(took, Ordering::Relaxed);
                    if took < least {
                        EARLY.fetch_add(1, Ordering::Relaxed);
                    }
                    if buf != block {
                        BAD.fetch_add(1, Ordering::Relaxed);
                    }
                    core::hint::black_box(hash(&buf, work));
                    DONE.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (early, bad, done) = (
        EARLY.load(Ordering::Relaxed),
        BAD.load(Ordering::Relaxed),
        DONE.load(Ordering::Relaxed),
    );
    println!(
        "RESULT exact ms={:.2} reads={done} early={early} bad={bad} fastest_us={:.1}",
        elapsed_ms(start),
        FASTEST.load(Ordering::Relaxed) as f64 * 1000.0 / tsc_khz() as f64
    );
    if early == 0 && bad == 0 && done == reads {
        0
    } else {
        1
    }
}
