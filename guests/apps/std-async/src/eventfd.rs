//! `std-async eventfd`: eventfd's semantics through libc, and wake-ups across threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{check, Result};

pub(crate) fn new(initval: u32, flags: i32) -> Result<i32> {
    // SAFETY: no pointers.
    let fd = unsafe { libc::eventfd(initval.into(), flags as _) };
    check("eventfd", fd as isize).map(|fd| fd as i32)
}

/// `read` of 8 bytes: the value or the OS error.
pub(crate) fn read(fd: i32) -> std::io::Result<u64> {
    let mut v = 0u64;
    // SAFETY: 8 writable bytes.
    let r = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// `write` of 8 bytes: the OS error if any.
pub(crate) fn write(fd: i32, v: u64) -> std::io::Result<()> {
    // SAFETY: 8 readable bytes.
    let r = unsafe { libc::write(fd, (&v as *const u64).cast(), 8) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn close(fd: i32) {
    // SAFETY: no pointers.
    unsafe { libc::close(fd) };
}

/// `Ok(value)`, or the error's raw number and kind.
fn kind(r: std::io::Result<impl std::fmt::Debug>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({:?} {:?})", e.raw_os_error().unwrap_or(0), e.kind()),
    }
}

pub(crate) fn run() -> Result<()> {
    // The counter: a read takes it all; writes add.
    let fd = new(3, libc::EFD_NONBLOCK as i32)?;
    write(fd, 4).map_err(|e| e.to_string())?;
    let first = kind(read(fd));
    let empty = kind(read(fd));
    println!("std-async eventfd: counter read {first}, then {empty}");
    // SAFETY: no pointers.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL, 0) };
    println!(
        "std-async eventfd: O_NONBLOCK in F_GETFL: {}",
        fl & libc::O_NONBLOCK != 0
    );
    let bad = kind(write(fd, u64::MAX));
    write(fd, u64::MAX - 1).map_err(|e| e.to_string())?;
    let full = kind(write(fd, 1));
    println!("std-async eventfd: write of u64::MAX {bad}; past the largest count {full}");
    close(fd);
    println!("std-async eventfd: read after close {}", kind(read(fd)));

    // The semaphore: one at a time.
    let sem = new(2, (libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK) as i32)?;
    let reads = [read(sem), read(sem), read(sem)].map(kind);
    println!("std-async eventfd: semaphore reads {reads:?}");
    close(sem);

    // A blocking read in one thread, woken by another thread's write 100 ms later.
    let fd = new(0, 0)?;
    let start = Instant::now();
    let reader = std::thread::spawn(move || (read(fd).map_err(|e| e.to_string()), start.elapsed()));
    std::thread::sleep(Duration::from_millis(100));
    write(fd, 7).map_err(|e| e.to_string())?;
    let (got, after) = reader.join().map_err(|_| "the reader panicked")?;
    println!(
        "std-async eventfd: blocking read got {:?} after 100 ms or more: {}",
        got?,
        after >= Duration::from_millis(100)
    );
    // A blocking write past the largest count waits for a read.
    write(fd, u64::MAX - 1).map_err(|e| e.to_string())?;
    let wrote = Arc::new(AtomicBool::new(false));
    let writer = {
        let wrote = wrote.clone();
        std::thread::spawn(move || {
            let r = write(fd, 5).map_err(|e| e.to_string());
            wrote.store(true, Ordering::SeqCst);
            r
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let early = wrote.load(Ordering::SeqCst);
    let took = read(fd).map_err(|e| e.to_string())?;
    writer.join().map_err(|_| "the writer panicked")??;
    let then = read(fd).map_err(|e| e.to_string())?;
    println!(
        "std-async eventfd: blocking write waited: {}, read {took:#x} then {then}",
        !early
    );
    close(fd);

    // Ping-pong: two threads, two eventfds, blocking reads.
    const ROUNDS: u64 = 10_000;
    let (ping, pong) = (new(0, 0)?, new(0, 0)?);
    let other = std::thread::spawn(move || -> Result<()> {
        for _ in 0..ROUNDS {
            let v = read(ping).map_err(|e| e.to_string())?;
            write(pong, v).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let start = Instant::now();
    let mut wrong = 0;
    for i in 1..=ROUNDS {
        write(ping, i).map_err(|e| e.to_string())?;
        wrong += u64::from(read(pong).map_err(|e| e.to_string())? != i);
    }
    let took = start.elapsed();
    other.join().map_err(|_| "the other thread panicked")??;
    println!("std-async eventfd: ping-pong {ROUNDS} round trips, wrong values: {wrong}");
    eprintln!(
        "std-async eventfd: round trip {:.2} us",
        took.as_secs_f64() * 1e6 / ROUNDS as f64
    );
    close(ping);
    close(pong);
    println!("std-async eventfd: done");
    Ok(())
}
