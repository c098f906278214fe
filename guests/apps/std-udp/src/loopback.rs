//! `std-udp self UDPPORT TCPPORT`: the guest talks to itself through the host's loopback, so no
//! peer outside it is needed (the aarch64 suite runs it inside its arm64 machine). activm must
//! publish guest port 53/udp as host `UDPPORT` and guest port 80 as host `TCPPORT`, and allow
//! connections to `127.0.0.1:UDPPORT/udp` and `127.0.0.1:TCPPORT`. Steps, each printed:
//! - UDP both ways: a client's datagram reaches the guest's own server through the published
//!   port, and the server's answer reaches the client;
//! - a read timeout that passes (nothing is sent);
//! - TCP: a client thread connects to the published port, the guest's listener accepts, and
//!   64 KiB go each way, checked byte for byte;
//! - a wait beside a thread that computes and never yields: the server's `recv_from` waits
//!   while that thread keeps computing and a third thread sends 100 ms later;
//! - IPv6 (a view of IPv4 loopback here): the same ports bound as `[::]`, dialled as `[::1]`,
//!   with the addresses each side sees.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::{ctx, Result};

fn pattern(i: usize) -> u8 {
    (i ^ (i >> 8) ^ 0x5a) as u8
}

pub fn run(udp_port: &str, tcp_port: &str) -> Result<()> {
    let server = UdpSocket::bind("0.0.0.0:53").map_err(ctx("bind server"))?;
    let client = UdpSocket::bind("127.0.0.1:0").map_err(ctx("bind client"))?;
    let published = format!("127.0.0.1:{udp_port}");
    client
        .send_to(b"ping", &published)
        .map_err(ctx("send_to"))?;
    let mut buf = [0u8; 64];
    let (n, from) = server
        .recv_from(&mut buf)
        .map_err(ctx("server recv_from"))?;
    println!(
        "std-udp self: server got {}",
        String::from_utf8_lossy(&buf[..n])
    );
    server.send_to(b"pong", from).map_err(ctx("answer"))?;
    let (n, _) = client
        .recv_from(&mut buf)
        .map_err(ctx("client recv_from"))?;
    println!(
        "std-udp self: client got {}",
        String::from_utf8_lossy(&buf[..n])
    );

    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(ctx("set_read_timeout"))?;
    let started = Instant::now();
    let e = client.recv(&mut buf).map(|_| ()).map_err(|e| e.kind());
    println!(
        "std-udp self: recv with a 50 ms timeout: {e:?}, after 50 ms or more: {}",
        started.elapsed() >= Duration::from_millis(50)
    );

    tcp_both_ways(tcp_port)?;
    wait_beside_a_spinner(&server, &published)?;
    drop((server, client));
    ipv6(udp_port, tcp_port)?;
    println!("std-udp self: done");
    Ok(())
}

/// 64 KiB each way between a client thread and the guest's own listener.
fn tcp_both_ways(tcp_port: &str) -> Result<()> {
    const LEN: usize = 64 << 10;
    let listener = TcpListener::bind("0.0.0.0:80").map_err(ctx("listen"))?;
    let addr = format!("127.0.0.1:{tcp_port}");
    let client = std::thread::spawn(move || -> Result<usize> {
        let mut s = TcpStream::connect(&addr).map_err(ctx("connect"))?;
        let out: Vec<u8> = (0..LEN).map(pattern).collect();
        s.write_all(&out).map_err(ctx("client write"))?;
        let mut back = vec![0u8; LEN];
        s.read_exact(&mut back).map_err(ctx("client read"))?;
        Ok(back
            .iter()
            .enumerate()
            .filter(|&(i, &b)| b != pattern(i).wrapping_add(1))
            .count())
    });
    let (mut conn, _) = listener.accept().map_err(ctx("accept"))?;
    let mut got = vec![0u8; LEN];
    conn.read_exact(&mut got).map_err(ctx("server read"))?;
    let wrong_in = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    let answer: Vec<u8> = got.iter().map(|b| b.wrapping_add(1)).collect();
    conn.write_all(&answer).map_err(ctx("server write"))?;
    let wrong_back = client.join().map_err(|_| "the client thread panicked")??;
    println!("std-udp self: tcp {LEN} bytes each way, wrong bytes: {wrong_in} and {wrong_back}");
    Ok(())
}

/// The server's `recv_from` waits while a thread computes without ever yielding; a third
/// thread sends after 100 ms.
fn wait_beside_a_spinner(server: &UdpSocket, published: &str) -> Result<()> {
    let computer = crate::Computer::start(false);
    let (count, stop, spinner) = (computer.count, computer.stop, computer.thread);
    let sender = {
        let published = published.to_string();
        std::thread::spawn(move || -> Result<()> {
            std::thread::sleep(Duration::from_millis(100));
            let s = UdpSocket::bind("127.0.0.1:0").map_err(ctx("bind sender"))?;
            s.send_to(b"late", &published).map_err(ctx("send late"))?;
            Ok(())
        })
    };
    let before = count.load(Ordering::Relaxed);
    let mut buf = [0u8; 64];
    let (n, _) = server.recv_from(&mut buf).map_err(ctx("wait"))?;
    let during = count.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let _ = spinner.join();
    sender.join().map_err(|_| "the sender panicked")??;
    println!(
        "std-udp self: waited for {}; computed during the wait: {}",
        String::from_utf8_lossy(&buf[..n]),
        during > 0
    );
    Ok(())
}

/// UDP and TCP through IPv6 sockets: servers on `[::]`, clients to `[::1]`; prints the
/// addresses each side sees.
fn ipv6(udp_port: &str, tcp_port: &str) -> Result<()> {
    let server = UdpSocket::bind("[::]:53").map_err(ctx("bind [::]:53"))?;
    let client = UdpSocket::bind("[::1]:0").map_err(ctx("bind [::1]:0"))?;
    client
        .send_to(b"ping6", format!("[::1]:{udp_port}"))
        .map_err(ctx("send_to [::1]"))?;
    let mut buf = [0u8; 64];
    let (n, from) = server.recv_from(&mut buf).map_err(ctx("recv_from v6"))?;
    server.send_to(b"pong6", from).map_err(ctx("answer v6"))?;
    let (m, back_from) = client
        .recv_from(&mut buf[n..])
        .map_err(ctx("client recv v6"))?;
    println!(
        "std-udp self: udp6 {} and {}; server bound {}, sender is IPv6: {}, answer from {back_from}",
        String::from_utf8_lossy(&buf[..n]),
        String::from_utf8_lossy(&buf[n..n + m]),
        server.local_addr().map_err(ctx("local_addr v6"))?,
        from.is_ipv6()
    );
    let listener = TcpListener::bind("[::]:80").map_err(ctx("listen [::]:80"))?;
    let addr = format!("[::1]:{tcp_port}");
    let dialer = std::thread::spawn(move || -> Result<String> {
        let mut s = TcpStream::connect(&addr).map_err(ctx("connect [::1]"))?;
        s.write_all(b"hello6").map_err(ctx("write v6"))?;
        let mut back = [0u8; 6];
        s.read_exact(&mut back).map_err(ctx("read v6"))?;
        Ok(format!(
            "{} from {}",
            String::from_utf8_lossy(&back),
            s.peer_addr().map_err(ctx("peer_addr v6"))?
        ))
    });
    let (mut conn, peer) = listener.accept().map_err(ctx("accept v6"))?;
    let mut got = [0u8; 6];
    conn.read_exact(&mut got).map_err(ctx("server read v6"))?;
    conn.write_all(b"HELLO6").map_err(ctx("server write v6"))?;
    let seen = dialer.join().map_err(|_| "the v6 client panicked")??;
    println!(
        "std-udp self: tcp6 {} -> {seen}; listener {}, peer is IPv6: {}",
        String::from_utf8_lossy(&got),
        listener.local_addr().map_err(ctx("listener addr v6"))?,
        peer.is_ipv6()
    );
    let elsewhere = TcpStream::connect("[2001:db8::1]:80")
        .map(|_| ())
        .map_err(|e| e.kind());
    println!("std-udp self: tcp6 to [2001:db8::1]:80: {elsewhere:?}");
    Ok(())
}
