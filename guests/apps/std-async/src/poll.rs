//! `std-async poll PORT`: `poll` of a listener, an eventfd and a stream together.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
#[cfg(not(target_os = "hermit"))]
use std::os::fd::AsRawFd;
#[cfg(target_os = "hermit")]
use std::os::hermit::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::eventfd::{close, new, read, write};
use crate::{ctx, Result};

/// `poll` of `(fd, events)` pairs: the result (or the OS error's raw number, negated) and each
/// `revents`.
fn poll(fds: &[(i32, i16)], timeout: i32) -> (i32, Vec<i16>) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    // SAFETY: `p.len()` pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as _, timeout) };
    let r = if r < 0 {
        -std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        r
    };
    (r, p.iter().map(|p| p.revents).collect())
}

fn later(ms: u64, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        f()
    })
}

pub(crate) fn run(port: u16) -> Result<()> {
    let listener = TcpListener::bind("0.0.0.0:80").map_err(ctx("bind"))?;
    let efd = new(0, libc::EFD_NONBLOCK as i32)?;
    let l = listener.as_raw_fd();
    let (pin, pout) = (libc::POLLIN, libc::POLLOUT);

    let start = Instant::now();
    let (n, _) = poll(&[(l, pin), (efd, pin)], 0);
    println!(
        "std-async poll: timeout 0: {n} ready, at once: {}",
        start.elapsed() < Duration::from_millis(20)
    );
    let start = Instant::now();
    let (n, _) = poll(&[(l, pin), (efd, pin)], 50);
    let took = start.elapsed();
    println!(
        "std-async poll: timeout 50 ms: {n} ready, after 50 ms or more: {}, within 2 s: {}",
        took >= Duration::from_millis(50),
        took < Duration::from_secs(2)
    );

    // No timeout, beside a computing thread: another thread's eventfd write ends it.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let computer = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rounds.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let start = Instant::now();
    let writer = later(100, move || drop(write(efd, 1)));
    let (n, revents) = poll(&[(l, pin), (efd, pin)], -1);
    let took = start.elapsed();
    let computed = rounds.load(Ordering::Relaxed) > 0;
    stop.store(true, Ordering::Relaxed);
    computer
        .join()
        .map_err(|_| "the computing thread panicked")?;
    writer.join().map_err(|_| "the writer panicked")?;
    println!(
        "std-async poll: no timeout: {n} ready {revents:?} after 100 ms or more: {}; computed during the wait: {computed}",
        took >= Duration::from_millis(100)
    );
    read(efd).map_err(|e| e.to_string())?;

    // A connection arrives on the listener.
    let client = std::thread::spawn(move || TcpStream::connect(("127.0.0.1", port)));
    let (n, revents) = poll(&[(l, pin), (efd, pin)], 5000);
    println!("std-async poll: connection: {n} ready {revents:?}");
    let (mut stream, _) = listener.accept().map_err(ctx("accept"))?;
    let mut peer = client
        .join()
        .map_err(|_| "the client panicked")?
        .map_err(ctx("connect"))?;
    let s = stream.as_raw_fd();
    let (n, revents) = poll(&[(l, pin), (efd, pin), (s, pin | pout)], -1);
    println!("std-async poll: stream writable at once: {n} ready {revents:?}");

    // Bytes arrive on the stream 100 ms later.
    let mut peer2 = peer.try_clone().map_err(ctx("try_clone"))?;
    let sender = later(100, move || drop(peer2.write_all(b"hi")));
    let (n, revents) = poll(&[(l, pin), (efd, pin), (s, pin)], 2000);
    sender.join().map_err(|_| "the sender panicked")?;
    let mut buf = [0u8; 16];
    let got = stream.read(&mut buf).map_err(ctx("read"))?;
    println!(
        "std-async poll: bytes: {n} ready {revents:?}, read {:?}",
        String::from_utf8_lossy(&buf[..got])
    );

    // Two at once.
    peer.write_all(b"x").map_err(ctx("write"))?;
    write(efd, 1).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(50));
    let (n, revents) = poll(&[(l, pin), (efd, pin), (s, pin)], 1000);
    println!("std-async poll: two at once: {n} ready {revents:?}");
    stream.read(&mut buf).map_err(ctx("read"))?;
    read(efd).map_err(|e| e.to_string())?;

    // The peer closes: the end of the stream is readable.
    drop(peer);
    let (n, revents) = poll(&[(efd, pin), (s, pin)], 2000);
    let eof = stream.read(&mut buf).map_err(ctx("read"))?;
    println!("std-async poll: peer closed: {n} ready {revents:?}, read {eof}");

    // Bad arguments.
    // SAFETY: a null array is what is tested; the call must fail, not read it.
    let null = unsafe { libc::poll(std::ptr::null_mut(), 1, 0) };
    let null_err = std::io::Error::last_os_error().raw_os_error();
    let mut one = libc::pollfd {
        fd: efd,
        events: pin,
        revents: 0,
    };
    // SAFETY: a huge count is what is tested; the call must fail before reading past `one`.
    let huge = unsafe { libc::poll(&mut one, 1 << 40, 0) };
    let huge_err = std::io::Error::last_os_error().raw_os_error();
    println!(
        "std-async poll: null array fails: {} errno {null_err:?}, 2^40 descriptors fail: {} errno {huge_err:?}",
        null < 0,
        huge < 0
    );
    let closed = new(0, 0)?;
    close(closed);
    let (n, revents) = poll(
        &[(999_999_999, pin), (closed, pin), (-1, pin), (efd, pout)],
        0,
    );
    println!("std-async poll: unknown, closed, negative, eventfd POLLOUT: {n} ready {revents:?}");
    let start = Instant::now();
    let (n, _) = poll(&[], 30);
    println!(
        "std-async poll: no descriptors, 30 ms: {n}, after 30 ms or more: {}",
        start.elapsed() >= Duration::from_millis(30)
    );
    close(efd);
    println!("std-async poll: done");
    Ok(())
}
