//! The mio echo server (`serve`) and the self-test (`self`): an event loop on one thread with a
//! 10 ms timer, connections in a slab, every read echoed back as the stream takes it.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::{ctx, Result};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const TICK: Duration = Duration::from_millis(10);
/// Bytes each self-test connection sends and expects back.
const BYTES: usize = 65_536;

/// One accepted connection: what was read and not echoed yet.
struct Conn {
    stream: TcpStream,
    pending: Vec<u8>,
    eof: bool,
}

/// What the server did.
pub(crate) struct Served {
    accepted: usize,
    ticks: u64,
    woken: bool,
}

/// Reads what `c` has and writes back what it takes: whether the connection is finished.
fn pump(c: &mut Conn) -> std::io::Result<bool> {
    let mut buf = [0u8; 16384];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => {
                c.eof = true;
                break;
            }
            Ok(n) => c.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    while !c.pending.is_empty() {
        match c.stream.write(&c.pending) {
            Ok(n) => {
                c.pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(c.eof && c.pending.is_empty())
}

/// The event loop: serves until `closed` connections ended (0: until the waker), ticking the
/// timer every 10 ms.
fn serve_loop(mut poll: Poll, mut listener: TcpListener, closed: usize) -> Result<Served> {
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(ctx("register"))?;
    let mut conns: HashMap<Token, Conn> = HashMap::new();
    let mut next = 2;
    let mut events = Events::with_capacity(64);
    let mut served = Served {
        accepted: 0,
        ticks: 0,
        woken: false,
    };
    let mut ended = 0;
    let mut tick_at = Instant::now() + TICK;
    loop {
        let now = Instant::now();
        if now >= tick_at {
            served.ticks += 1;
            tick_at += TICK;
            continue;
        }
        poll.poll(&mut events, Some(tick_at - now))
            .map_err(ctx("poll"))?;
        for ev in events.iter() {
            match ev.token() {
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let token = Token(next);
                            next += 1;
                            poll.registry()
                                .register(
                                    &mut stream,
                                    token,
                                    Interest::READABLE | Interest::WRITABLE,
                                )
                                .map_err(ctx("register"))?;
                            conns.insert(
                                token,
                                Conn {
                                    stream,
                                    pending: Vec::new(),
                                    eof: false,
                                },
                            );
                            served.accepted += 1;
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("accept: {e}")),
                    }
                },
                WAKER => served.woken = true,
                token => {
                    let Some(c) = conns.get_mut(&token) else {
                        continue;
                    };
                    let finished = pump(c).map_err(|e| {
                        format!(
                            "echo of connection {}: {e} ({} pending)",
                            token.0,
                            c.pending.len()
                        )
                    })?;
                    if finished {
                        let mut c = conns.remove(&token).expect("present");
                        poll.registry()
                            .deregister(&mut c.stream)
                            .map_err(ctx("deregister"))?;
                        ended += 1;
                    }
                }
            }
        }
        if served.woken || (closed > 0 && ended >= closed) {
            return Ok(served);
        }
    }
}

fn listen() -> Result<TcpListener> {
    TcpListener::bind("0.0.0.0:80".parse().expect("an address")).map_err(ctx("bind"))
}

/// `serve N`: the echo server until N connections ended.
pub(crate) fn serve(connections: usize) -> Result<()> {
    let poll = Poll::new().map_err(ctx("Poll::new"))?;
    let listener = listen()?;
    println!("std-async serve: listening on 0.0.0.0:80");
    let served = serve_loop(poll, listener, connections.max(1))?;
    println!(
        "std-async serve: {} connections echoed, timer ticked while serving: {}",
        served.accepted,
        served.ticks > 0
    );
    Ok(())
}

/// One client connection: its byte pattern, how far it sent and checked.
struct Client {
    stream: TcpStream,
    id: u8,
    sent: usize,
    received: usize,
    wrong: usize,
}

fn byte(id: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(id)
}

/// Sends what `c` may and checks what came back: whether all came back.
fn drive(c: &mut Client) -> std::io::Result<bool> {
    let data: Vec<u8> = (c.sent..BYTES).map(|i| byte(c.id, i)).collect();
    let mut at = 0;
    while at < data.len() {
        match c.stream.write(&data[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::NotConnected => break, // connecting
            Err(e) => return Err(e),
        }
    }
    c.sent += at;
    let mut buf = [0u8; 16384];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                for (k, &b) in buf[..n].iter().enumerate() {
                    c.wrong += usize::from(b != byte(c.id, c.received + k));
                }
                c.received += n;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::NotConnected => break,
            Err(e) => return Err(e),
        }
    }
    Ok(c.received >= BYTES)
}

/// The client thread: `n` connections to `addr` at once, each `BYTES` each way.
fn clients(addr: SocketAddr, n: usize) -> Result<(usize, usize)> {
    let mut poll = Poll::new().map_err(ctx("client Poll::new"))?;
    let mut live: HashMap<Token, Client> = HashMap::new();
    for i in 0..n {
        let mut stream = TcpStream::connect(addr).map_err(ctx("connect"))?;
        poll.registry()
            .register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(ctx("client register"))?;
        live.insert(
            Token(i),
            Client {
                stream,
                id: i as u8,
                sent: 0,
                received: 0,
                wrong: 0,
            },
        );
    }
    let (mut done, mut wrong) = (0, 0);
    let mut events = Events::with_capacity(64);
    let give_up = Instant::now() + Duration::from_secs(30);
    while !live.is_empty() {
        if Instant::now() > give_up {
            return Err(format!("{} connections unfinished after 30 s", live.len()));
        }
        poll.poll(&mut events, Some(Duration::from_secs(1)))
            .map_err(ctx("client poll"))?;
        for ev in events.iter() {
            let Some(c) = live.get_mut(&ev.token()) else {
                continue;
            };
            if let Some(e) = c.stream.take_error().map_err(ctx("take_error"))? {
                return Err(format!("connection {}: {e}", c.id));
            }
            let finished = drive(c).map_err(|e| {
                format!(
                    "client connection {}: {e} (sent {}, received {})",
                    c.id, c.sent, c.received
                )
            })?;
            if finished {
                let c = live.remove(&ev.token()).expect("present");
                wrong += c.wrong;
                done += 1;
            }
        }
    }
    Ok((done, wrong))
}

/// `self PORT N`: the server, `N` connections to it through published port PORT from a client
/// thread, then the waker stops the server.
pub(crate) fn to_itself(port: u16, connections: usize) -> Result<()> {
    let poll = Poll::new().map_err(ctx("Poll::new"))?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(ctx("Waker::new"))?);
    let listener = listen()?;
    let server = std::thread::spawn(move || {
        // Printed at once: a failing server would leave its clients waiting.
        serve_loop(poll, listener, 0).inspect_err(|e| eprintln!("std-async: server: {e}"))
    });
    let addr: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(ctx("address"))?;
    let (done, wrong) = clients(addr, connections)?;
    println!("std-async self: {done} connections echoed {BYTES} bytes each, wrong bytes: {wrong}");
    std::thread::sleep(Duration::from_millis(50));
    waker.wake().map_err(ctx("wake"))?;
    let served = server.join().map_err(|_| "the server panicked")??;
    println!(
        "std-async self: server accepted {}, timer ticked while serving: {}, stopped by the waker: {}",
        served.accepted,
        served.ticks > 0,
        served.woken
    );
    println!("std-async self: done");
    Ok(())
}
