//! `std-kv netopts PORT REFUSED`: the socket calls ordinary std programs use, against the
//! test's peer on 127.0.0.1:PORT (tests/kvm/net_opts.rs): `localhost` resolution, read and
//! write timeouts, a read timeout racing the peer's bytes, `try_clone` from two threads and
//! `connect_timeout` to a listening and to a refused port. Prints one line per case; any
//! failure exits with status 1.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

fn fail(what: &str) -> ! {
    println!("netopts: FAILED: {what}");
    std::process::exit(1);
}

fn check<T>(r: io::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| fail(&format!("{what}: {e}")))
}

/// One line, byte by byte (nothing read beyond it).
fn line(mut s: &TcpStream) -> io::Result<String> {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.push(b[0]);
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

pub fn run(port: u16, refused: u16, listen_port: Option<u16>) {
    if "nosuchhost.invalid:80".to_socket_addrs().is_ok() {
        fail("nosuchhost.invalid resolved");
    }
    let a = check(TcpStream::connect(("localhost", port)), "connect localhost");
    let peer = check(a.peer_addr(), "peer_addr");
    println!("netopts: localhost:{port} connected to {peer}");

    // A read timeout that expires.
    let t = Duration::from_millis(200);
    check(a.set_read_timeout(Some(t)), "set_read_timeout");
    if check(a.read_timeout(), "read_timeout") != Some(t) {
        fail("read_timeout() is not what was set");
    }
    let start = Instant::now();
    match (&a).read(&mut [0u8; 16]) {
        Err(e) if timed_out(&e) => {
            let ms = start.elapsed().as_millis();
            if ms < 200 {
                fail(&format!("the read timed out after {ms} ms"));
            }
            println!("netopts: read timed out ({:?}) after >= 200 ms", e.kind());
        }
        other => fail(&format!("a read with nothing sent answered {other:?}")),
    }

    // A read timeout where the bytes come in time (100 ms after the request).
    check(a.set_read_timeout(Some(Duration::from_secs(5))), "set 5 s");
    check((&a).write_all(b"go\n"), "write go");
    if check(line(&a), "read hello") != "hello" {
        fail("no hello");
    }
    println!("netopts: read in time");

    // Bytes arriving around 1 ms deadlines: each exactly once, in order.
    check(
        a.set_read_timeout(Some(Duration::from_millis(1))),
        "set 1 ms",
    );
    check((&a).write_all(b"race\n"), "write race");
    let (mut got, mut timeouts) = (Vec::new(), 0u32);
    let begin = Instant::now();
    while got.len() < 200 {
        let mut buf = [0u8; 64];
        match (&a).read(&mut buf) {
            Ok(0) => fail("end of stream in the race"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if timed_out(&e) => timeouts += 1,
            Err(e) => fail(&format!("race: {e}")),
        }
        if begin.elapsed() > Duration::from_secs(60) {
            fail("race: not all bytes within 60 s");
        }
    }
    if got.iter().enumerate().any(|(i, &b)| b != i as u8) || got.len() != 200 {
        fail("race: bytes lost, doubled or out of order");
    }
    println!("netopts: race: 200 bytes in order ({timeouts} timeouts)");

    // try_clone: the clone's thread reads the reply to what the first wrote.
    check(a.set_read_timeout(Some(Duration::from_secs(5))), "set 5 s");
    let b = check(a.try_clone(), "try_clone");
    if check(b.read_timeout(), "clone's read_timeout") != Some(Duration::from_secs(5)) {
        fail("the clone has another read timeout");
    }
    let reader = std::thread::spawn(move || {
        let reply = line(&b);
        drop(b);
        reply
    });
    check((&a).write_all(b"ping\n"), "write ping");
    let reply = reader
        .join()
        .unwrap_or_else(|_| fail("the clone's thread panicked"));
    if check(reply, "the clone's read") != "pong" {
        fail("the clone read no pong");
    }
    check((&a).write_all(b"again\n"), "write after the clone's close");
    if check(line(&a), "read after the clone's close") != "again-ok" {
        fail("no again-ok");
    }
    println!("netopts: try_clone: the clone's thread read pong; the first works after its close");

    // connect_timeout to a listening and to a refused port.
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let c = check(
        TcpStream::connect_timeout(&to, Duration::from_secs(5)),
        "connect_timeout",
    );
    check((&c).write_all(b"second\n"), "write on the second stream");
    if check(line(&c), "read on the second stream") != "second-ok" {
        fail("no second-ok");
    }
    println!("netopts: connect_timeout connected");
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], refused));
    match TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            println!("netopts: connect_timeout refused: {e}")
        }
        other => fail(&format!("connect_timeout to a closed port: {other:?}")),
    }

    if let Some(guest_port) = listen_port {
        poll_listener(&a, guest_port);
    }

    // A write timeout against a peer that stopped reading.
    check((&a).write_all(b"stall\n"), "write stall");
    let t = Duration::from_millis(300);
    check(a.set_write_timeout(Some(t)), "set_write_timeout");
    if check(a.write_timeout(), "write_timeout") != Some(t) {
        fail("write_timeout() is not what was set");
    }
    let chunk = vec![7u8; 64 << 10];
    let mut sent = 0usize;
    loop {
        let start = Instant::now();
        match (&a).write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if timed_out(&e) => {
                let ms = start.elapsed().as_millis();
                if ms < 300 {
                    fail(&format!("the write timed out after {ms} ms"));
                }
                println!(
                    "netopts: write timed out ({:?}) after >= 300 ms, {} KiB taken before",
                    e.kind(),
                    sent >> 10
                );
                break;
            }
            Err(e) => fail(&format!("write: {e}")),
        }
        if sent > 256 << 20 {
            fail("256 MiB taken by a peer that does not read");
        }
    }
    println!("netopts: done");
    // Exit without waiting for the stalled stream's ring to drain.
    std::process::exit(0);
}

unsafe extern "C" {
    fn sys_poll(fds: *mut PollFd, nfds: usize, timeout: i32) -> i32;
}

/// hermit-abi's `pollfd`.
#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

fn poll_in(l: &std::net::TcpListener, ms: i32) -> (i32, i16) {
    use std::os::hermit::io::AsRawFd;
    let mut p = PollFd {
        fd: l.as_raw_fd(),
        events: 1,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { sys_poll(&mut p, 1, ms) };
    (r, p.revents)
}

/// `poll(POLLIN)` on a listener (the VMM's `poll` and, at the deadline, `cancel`): twice
/// nothing within 150 ms, then the peer's connection (asked for on `a`).
fn poll_listener(a: &TcpStream, guest_port: u16) {
    let l = check(
        std::net::TcpListener::bind(("0.0.0.0", guest_port)),
        "bind the published port",
    );
    for _ in 0..2 {
        let start = Instant::now();
        let (r, revents) = poll_in(&l, 150);
        let ms = start.elapsed().as_millis();
        if r != 0 || revents != 0 || ms < 150 {
            fail(&format!(
                "poll of an idle listener: {r} {revents:#x} after {ms} ms"
            ));
        }
    }
    check((&*a).write_all(b"listen\n"), "write listen");
    let (r, revents) = poll_in(&l, 10_000);
    if r != 1 || revents & 1 == 0 {
        fail(&format!(
            "poll of a listener with a connection: {r} {revents:#x}"
        ));
    }
    let (conn, _) = check(l.accept(), "accept after poll");
    drop(conn);
    println!("netopts: poll of a listener: 0 twice after >= 150 ms, then POLLIN");
}
