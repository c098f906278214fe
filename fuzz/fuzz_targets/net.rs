//! The std guests' socket calls (`devices/net.rs` and its modules) as a hostile guest makes
//! them: any operation number, socket number, buffer address (below the image, at the end of
//! RAM, beyond it, wrapping), length, wait tag, flag and packed address, a sequence of calls per
//! input, through the real `Net::call` into real host sockets on the loopback. The VMM's policy
//! publishes one TCP and one UDP port and allows one TCP and one UDP peer the target owns;
//! beside them a TCP listener and a UDP socket that nothing allows.
//!
//! Oracles: no panic; every result is `>= 0` or a `-errno`; a `Err` (a protocol violation, which
//! ends a real guest) ends the input; a byte count a transfer returns is within the buffer it
//! was given; a socket the guest closed answers `-EBADF` at once; guest RAM below the image is
//! never written; the forbidden
//! listener never gets a connection and the forbidden UDP socket never a datagram; and once the
//! input's `Net` is dropped, no host descriptor is left open.

#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::sync::OnceLock;

use activm::config::NetConfig;
use activm::devices::net::Net;
use activm::memory::{GuestRam, Plan};
use activm_fuzz::{Guest, Input, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::net::*;

/// Guest RAM just below the image, which no call may write.
const LOW_GUARD: u64 = 4096;
/// Buffers the fuzzer points calls at (any offset from here), and the ring's place.
const BUFS: u64 = 0x40_0000;
const RING: u64 = 0x3f_0000;
const STEPS: usize = 32;

struct World {
    guest: Guest,
    config: NetConfig,
    /// Packed addresses the fuzzer picks from: allowed, published and forbidden ones.
    addrs: Vec<u64>,
    /// What no guest may reach.
    forbidden_tcp: TcpListener,
    forbidden_udp: UdpSocket,
    /// Kept open so the allowed TCP peer accepts connections into its backlog.
    _allowed_tcp: TcpListener,
    allowed_udp: UdpSocket,
    /// Host descriptors open between inputs.
    fds: usize,
}

fn pack(a: SocketAddrV4) -> u64 {
    (u64::from(u32::from(*a.ip())) << 16) | u64::from(a.port())
}

fn local(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

/// Two ports free for both TCP and UDP on the loopback, below the host's ephemeral range: every
/// input binds them again, and an ephemeral port could meanwhile go to any process's socket
/// (the run that found this saw `--publish ...: Address already in use` after 100 s).
fn free_ports() -> (u16, u16) {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let start = 10_000 + (std::process::id() % 10_000) as u16;
    let mut free = (start..low.max(start + 1))
        .chain(1024..start)
        .filter(|&p| TcpListener::bind(local(p)).is_ok() && UdpSocket::bind(local(p)).is_ok());
    let tcp = free.next().expect("a free port");
    (tcp, free.next().expect("another free port"))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let allowed_tcp = TcpListener::bind(local(0)).expect("allowed listener");
        let allowed_udp = UdpSocket::bind(local(0)).expect("allowed UDP peer");
        allowed_udp.set_nonblocking(true).expect("non-blocking");
        let forbidden_tcp = TcpListener::bind(local(0)).expect("forbidden listener");
        forbidden_tcp.set_nonblocking(true).expect("non-blocking");
        let forbidden_udp = UdpSocket::bind(local(0)).expect("forbidden UDP socket");
        forbidden_udp.set_nonblocking(true).expect("non-blocking");
        let addr = |s: std::io::Result<std::net::SocketAddr>| match s.expect("an address") {
            std::net::SocketAddr::V4(a) => a,
            other => panic!("not IPv4: {other}"),
        };
        let (a_tcp, a_udp) = (
            addr(allowed_tcp.local_addr()),
            addr(allowed_udp.local_addr()),
        );
        let (f_tcp, f_udp) = (
            addr(forbidden_tcp.local_addr()),
            addr(forbidden_udp.local_addr()),
        );
        let (tcp_port, udp_port) = free_ports();
        let config = NetConfig {
            publish: vec![(tcp_port, 80)],
            allow_connect: vec![a_tcp],
            publish_udp: vec![(udp_port, 53)],
            allow_connect_udp: vec![a_udp],
        };
        let addrs = vec![
            pack(a_tcp),
            pack(a_udp),
            pack(f_tcp),
            pack(f_udp),
            pack(local(80)),
            pack(local(53)),
            pack(local(tcp_port)),
            pack(local(udp_port)),
            pack(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80)),
            pack(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            0,
        ];
        World {
            guest: Guest::new(2),
            config,
            addrs,
            forbidden_tcp,
            forbidden_udp,
            _allowed_tcp: allowed_tcp,
            allowed_udp,
            fds: open_fds(),
        }
    })
}

/// Whether to print every call and its result (`ACTIVM_FUZZ_TRACE=1`, to see what an input does).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("ACTIVM_FUZZ_TRACE").is_some())
}

/// A guest address for a buffer: mostly inside the buffer area, sometimes anywhere hostile.
fn gpa(input: &mut Input) -> u64 {
    match input.u8() % 8 {
        0 => input.u64(),
        1 => MEM_SIZE - u64::from(input.u8()),
        2 => u64::from(input.u8()) * 64,
        3 => u64::MAX - u64::from(input.u8()),
        _ => BUFS + u64::from(input.u32() % 0x8_0000),
    }
}

fn length(input: &mut Input) -> u64 {
    match input.u8() % 6 {
        0 => input.u64(),
        1 => NET_UDP_MAX + u64::from(input.u8()),
        _ => u64::from(input.u32() % 0x2_0000),
    }
}

fn tag(input: &mut Input) -> u64 {
    match input.u8() % 4 {
        0 => NET_NO_WAIT,
        1 => input.u64(),
        _ => u64::from(input.u32()) % (NET_RING_CAPACITY as u64 + 2),
    }
}

fn addr(world: &World, input: &mut Input) -> u64 {
    match input.u8() % 8 {
        0 => input.u64(),
        n => world.addrs[(usize::from(n) + usize::from(input.u8())) % world.addrs.len()],
    }
}

/// One call's arguments: `(op << 32 | socket, a1, a2, a3)`.
fn call_args(world: &World, input: &mut Input) -> [u64; 4] {
    let op = match input.u8() % 16 {
        0 => u64::from(input.u32()),
        1 => u64::from(input.u8()),
        _ => u64::from(input.u8() % 26),
    };
    let s = match input.u8() % 8 {
        0 => u64::from(input.u32()),
        _ => u64::from(input.u8() % 6),
    };
    let head = (op << 32) | (s & 0xffff_ffff);
    let args = match op {
        NET_OP_SOCKET => [input.u64() % 4, 0, 0],
        NET_OP_BIND | NET_OP_UDP_CONNECT => [addr(world, input), 0, 0],
        NET_OP_CONNECT => [addr(world, input), tag(input), 0],
        NET_OP_ACCEPT => [tag(input), gpa(input), gpa(input)],
        NET_OP_RECV | NET_OP_SEND => {
            let flags = u64::from(input.u8() % 4) << 32;
            [gpa(input), length(input), tag(input) | flags]
        }
        NET_OP_UDP_SENDTO => [
            gpa(input),
            length(input) | tag(input) << 32,
            addr(world, input),
        ],
        NET_OP_UDP_RECVFROM | NET_OP_UDP_PEEKFROM => {
            [gpa(input), length(input) | tag(input) << 32, gpa(input)]
        }
        NET_OP_RX_SETUP | NET_OP_TX_SETUP => [gpa(input), 0, 0],
        NET_OP_POLL => [u64::from(input.u8()), tag(input), 0],
        NET_OP_CANCEL => [tag(input), 0, 0],
        _ => [input.u64(), input.u64(), input.u64()],
    };
    [head, args[0], args[1], args[2]]
}

/// Nothing reached what the policy forbids: no connection waits on the forbidden listener, no
/// datagram on the forbidden socket. The allowed UDP peer is emptied for the next input.
fn check_forbidden(world: &World) {
    match world.forbidden_tcp.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the forbidden listener was reached: {other:?}"),
    }
    let mut buf = [0u8; 64];
    match world.forbidden_udp.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the forbidden UDP socket was reached: {other:?}"),
    }
    while world.allowed_udp.recv_from(&mut buf).is_ok() {}
}

/// What `r`, the result of the call `args`, must satisfy beyond being a value or a `-errno`.
fn check_result(ram: &GuestRam, plan: &Plan, net: &Net, args: [u64; 4], r: u64) {
    if (r as i64) < 0 || r == NET_WAITING {
        return;
    }
    let (op, s) = (args[0] >> 32, args[0] & 0xffff_ffff);
    // The most a transfer may report: what it was asked for, capped as the protocol says.
    let most = match op {
        NET_OP_RECV | NET_OP_SEND => Some(args[2].min(1 << 20)),
        NET_OP_UDP_SENDTO..=NET_OP_UDP_PEEKFROM => Some((args[2] & 0xffff_ffff).min(NET_UDP_MAX)),
        _ => None,
    };
    if let Some(most) = most {
        assert!(
            r <= most,
            "net call {args:x?} moved {r} bytes, more than {most}"
        );
    }
    if op == NET_OP_CLOSE && r == 0 {
        let probe = [(NET_OP_GETOPT << 32) | s, NET_OPT_ERROR, 0, 0];
        let after = net.call(ram, plan, probe);
        assert_eq!(
            after,
            Ok((-i64::from(libc::EBADF)) as u64),
            "socket {s} answered after its close"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    let mut input = Input(data);
    let ram = &world.guest.ram;
    let plan = &world.guest.plan;
    let guard = plan.image.start - LOW_GUARD;
    ram.write_bytes(guard, &[0xa5; LOW_GUARD as usize])
        .expect("guard in RAM");
    let fill = input.u8();
    ram.write_bytes(BUFS, &[fill; 4096])
        .expect("buffers in RAM");
    {
        // A fresh socket table, epoll instance and published sockets for every input.
        let net = Net::open(&world.config).expect("the policy's sockets");
        if input.u8() % 4 != 0 {
            let at = if input.u8() % 8 == 0 {
                input.u64()
            } else {
                RING
            };
            if net.setup(ram, plan, at).is_err() {
                return;
            }
        }
        for _ in 0..STEPS {
            if input.is_empty() {
                break;
            }
            let args = call_args(world, &mut input);
            let Ok(r) = net.call(ram, plan, args) else {
                // A protocol violation: a real guest is ended here.
                break;
            };
            let r = r as i64;
            if trace() {
                eprintln!(
                    "net: op {} socket {} {:x?} -> {r}",
                    args[0] >> 32,
                    args[0] as u32,
                    &args[1..]
                );
            }
            assert!(
                r >= 0 || (-4095..0).contains(&r),
                "net call {args:x?} returned {r:#x}"
            );
            check_result(ram, plan, &net, args, r as u64);
            if input.u8() % 8 == 0 {
                // The transmit doorbell: send what every ring holds.
                if net.ring_doorbell(ram).is_err() {
                    break;
                }
            }
        }
    }
    let low = ram.read_bytes(guard, LOW_GUARD).expect("guard in RAM");
    assert!(
        low.iter().all(|&b| b == 0xa5),
        "a net call wrote below the image"
    );
    check_forbidden(world);
    assert_eq!(
        open_fds(),
        world.fds,
        "a host descriptor outlived its input"
    );
});
