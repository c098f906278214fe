//! `std::net::UdpSocket` as an ordinary program uses it (tests/kvm/net_udp.rs drives it).
//!
//! `std-udp GUESTPORT ECHO OTHER`: binds `0.0.0.0:GUESTPORT` (a server) and `127.0.0.1:0` (a
//! client), then talks to the test's echo socket at ECHO: `send_to`/`recv_from`, `connect` +
//! `send`/`recv` with a datagram larger than the buffer (truncated, the rest dropped),
//! `peek_from`, a `recv` whose read timeout passes before the echo's late answer (which the next
//! `recv` takes), a non-blocking `recv`, a refused `send_to` to OTHER, and finally a
//! `recv_from` on the server socket that waits while another thread computes; the server
//! answers the test's second socket (with `spin`, the computing thread never yields). Prints
//! each step; exits 1 with the error on failure. `std-udp self UDPPORT TCPPORT` talks to
//! itself through the host's loopback instead (`loopback.rs`).

mod loopback;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, String>;

pub(crate) fn ctx<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A thread that computes until `stop`, counting rounds in `count`; `yields`: it calls
/// `yield_now` after each round, else it never reaches a scheduling point.
pub(crate) struct Computer {
    pub count: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<u64>,
}

impl Computer {
    pub fn start(yields: bool) -> Computer {
        let (count, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (count, stop) = (count.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    if yields {
                        std::thread::yield_now();
                    }
                }
                x
            })
        };
        Computer {
            count,
            stop,
            thread,
        }
    }
}

fn recv_text(sock: &UdpSocket, room: usize) -> Result<(String, SocketAddr)> {
    let mut buf = vec![0u8; room];
    let (n, from) = sock.recv_from(&mut buf).map_err(ctx("recv_from"))?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
}

fn run(args: &[String]) -> Result<()> {
    let (port, echo, other, spin) = match args {
        [port, echo, other] => (port, echo, other, false),
        [port, echo, other, spin] if spin == "spin" => (port, echo, other, true),
        _ => return Err("usage: std-udp GUESTPORT ECHO OTHER [spin]".into()),
    };
    let echo: SocketAddr = echo.parse().map_err(ctx("ECHO"))?;
    let other: SocketAddr = other.parse().map_err(ctx("OTHER"))?;
    let server = UdpSocket::bind(format!("0.0.0.0:{port}")).map_err(ctx("bind server"))?;
    println!(
        "std-udp: server on {}",
        server.local_addr().map_err(ctx("local_addr"))?
    );
    let client = UdpSocket::bind("127.0.0.1:0").map_err(ctx("bind client"))?;
    let local = client.local_addr().map_err(ctx("local_addr"))?;
    println!("std-udp: client port is set: {}", local.port() != 0);

    client.send_to(b"ping", echo).map_err(ctx("send_to"))?;
    let (text, from) = recv_text(&client, 64)?;
    println!("std-udp: {text} from the echo: {}", from == echo);

    client.connect(echo).map_err(ctx("connect"))?;
    let peer = client.peer_addr().map_err(ctx("peer_addr"))?;
    println!("std-udp: connected to the echo: {}", peer == echo);
    client.send(b"hello").map_err(ctx("send"))?;
    let mut small = [0u8; 4];
    let n = client.recv(&mut small).map_err(ctx("recv"))?;
    println!(
        "std-udp: truncated to {n}: {}",
        String::from_utf8_lossy(&small[..n])
    );
    let mut big = [0u8; 64];
    let n = client.recv(&mut big).map_err(ctx("recv"))?;
    println!(
        "std-udp: next datagram: {}",
        String::from_utf8_lossy(&big[..n])
    );

    client.send(b"peek").map_err(ctx("send"))?;
    let (n, from) = client.peek_from(&mut big).map_err(ctx("peek_from"))?;
    let peeked = String::from_utf8_lossy(&big[..n]).into_owned();
    let (taken, _) = recv_text(&client, 64)?;
    println!(
        "std-udp: peeked {peeked} from the echo: {}, then took {taken}",
        from == echo
    );

    // A read timeout: the echo answers "late" after 200 ms; the 50 ms wait gives up first, and
    // the answer is then the next datagram, taken once.
    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(ctx("set_read_timeout"))?;
    client.send(b"late").map_err(ctx("send"))?;
    let started = Instant::now();
    let e = client.recv(&mut big).map(|_| ()).map_err(|e| e.kind());
    println!(
        "std-udp: recv with a 50 ms timeout: {e:?}, after 50 ms or more: {}",
        started.elapsed() >= Duration::from_millis(50)
    );
    client
        .set_read_timeout(None)
        .map_err(ctx("set_read_timeout"))?;
    let n = client.recv(&mut big).map_err(ctx("recv"))?;
    println!(
        "std-udp: after the timeout: {}",
        String::from_utf8_lossy(&big[..n])
    );

    client
        .set_nonblocking(true)
        .map_err(ctx("set_nonblocking"))?;
    let e = client.recv(&mut big).map(|_| ()).map_err(|e| e.kind());
    println!("std-udp: non-blocking recv: {e:?}");
    client
        .set_nonblocking(false)
        .map_err(ctx("set_nonblocking"))?;

    let e = client.send_to(b"nope", other).map_err(|e| e.to_string());
    println!("std-udp: send_to elsewhere: {e:?}");

    // The wait: another thread computes meanwhile (on 1 vCPU, only if the wait holds no
    // processor).
    // Only `yield_now`: on 1 vCPU the wait's report must still be taken (a yield with nothing
    // else runnable goes through the scheduler loop when reports wait). With `spin`, not even
    // that: the VMM interrupts the busy vCPU for the report.
    let computer = Computer::start(!spin);
    let (count, stop, worker) = (computer.count, computer.stop, computer.thread);
    client.send(b"serve").map_err(ctx("send"))?;
    let before = count.load(Ordering::Relaxed);
    let (text, from) = recv_text(&server, 64)?;
    let during = count.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    println!(
        "std-udp: server got {text}; computed during the wait: {}",
        during > 0
    );
    server
        .send_to(text.as_bytes(), from)
        .map_err(ctx("answer"))?;
    println!("std-udp: done");
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [mode, udp, tcp] if mode == "self" => loopback::run(udp, tcp),
        _ => run(&args),
    };
    if let Err(e) = result {
        println!("std-udp: {e}");
        std::process::exit(1);
    }
}
