//! UDP sockets for the guest (`NET_KIND_UDP`, operations `udp_sendto` ... `udp_connect`).
//!
//! Every host UDP socket exists before the sandbox closes, so no thread calls `socket` or
//! `bind` for one: a published port (`--publish 5353:53/udp`) is a socket bound to
//! `127.0.0.1:HOSTPORT`, taken by a guest `bind` of GUESTPORT; a guest with an outbound
//! allowance (`--allow-connect HOST:PORT/udp`) has [`POOL`] sockets bound to `127.0.0.1:0`,
//! taken by a `bind` of port 0. `close` gives them back (emptied and disconnected).
//!
//! A datagram may go to an allowed address, or to a sender this socket received from (a
//! server answers its clients, as an accepted TCP stream does). One exit per datagram: the VMM
//! moves it with `sendto(2)` / `recvfrom(2)` straight between the host socket and guest RAM; a
//! call that would block arms the socket under the guest's wait tag, as TCP's do.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

use protocol::net::*;

use super::{errno, neg, zeroed_sockaddr, Kind, Net, Table};
use crate::config::NetConfig;
use crate::memory::GuestRam;

/// Sockets bound to `127.0.0.1:0` per guest with an outbound UDP allowance.
const POOL: usize = 16;
/// Senders a socket remembers (and may answer).
const HEARD: usize = 64;

/// A guest UDP socket's state beyond `Sock`.
#[derive(Debug, Default)]
pub(super) struct Dgram {
    /// The published guest port it holds (goes back at close); `None`: from the pool.
    published: Option<u16>,
    /// The latest senders it received from.
    heard: VecDeque<u64>,
}

/// A guest's host UDP sockets not held by a guest socket.
#[derive(Debug, Default)]
pub(super) struct UdpPorts {
    /// By guest port: (host port, socket unless bound by the guest).
    published: HashMap<u16, (u16, Option<OwnedFd>)>,
    /// Sockets bound to `127.0.0.1:0`, with their packed local address.
    pool: Vec<(OwnedFd, u64)>,
}

fn bound_socket(port: u16) -> io::Result<(OwnedFd, u64)> {
    let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
    socket.set_nonblocking(true)?;
    let local = match socket.local_addr()? {
        std::net::SocketAddr::V4(a) => pack_addr(u32::from(*a.ip()), a.port()),
        std::net::SocketAddr::V6(_) => 0,
    };
    Ok((OwnedFd::from(socket), local))
}

/// Binds the published UDP ports and the pool (before the sandbox).
pub(super) fn open_ports(config: &NetConfig) -> io::Result<UdpPorts> {
    let mut ports = UdpPorts::default();
    for &(host, guest) in &config.publish_udp {
        let (fd, _) = bound_socket(host).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("--publish {host}:{guest}/udp: cannot bind 127.0.0.1:{host}: {e}"),
            )
        })?;
        if ports.published.insert(guest, (host, Some(fd))).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("UDP guest port {guest} is published twice"),
            ));
        }
    }
    if !config.allow_connect_udp.is_empty() {
        for _ in 0..POOL {
            ports.pool.push(bound_socket(0)?);
        }
    }
    Ok(ports)
}

fn sockaddr(addr: u64) -> libc::sockaddr_in {
    let (ip, port) = unpack_addr(addr);
    let mut sa = zeroed_sockaddr();
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = ip.to_be();
    sa
}

const SOCKADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

impl Net {
    /// `bind` of a UDP socket: a published guest port, or port 0 (a pooled socket).
    pub(super) fn udp_bind(&self, table: &mut Table, s: usize, addr: u64) -> u64 {
        let (ip, port) = unpack_addr(addr);
        let ip = Ipv4Addr::from(ip);
        if !(ip.is_unspecified() || ip.is_loopback()) {
            return neg(libc::EACCES);
        }
        if table.socks[s].as_ref().is_some_and(|k| k.fd.is_some()) {
            return neg(libc::EINVAL);
        }
        let (fd, local, published) = if port == 0 {
            if self.config.allow_connect_udp.is_empty() {
                return neg(libc::EACCES);
            }
            let Some((fd, local)) = table.udp.pool.pop() else {
                return neg(libc::EADDRINUSE);
            };
            (fd, local, None)
        } else {
            let Some((_, slot)) = table.udp.published.get_mut(&port) else {
                return neg(libc::EACCES);
            };
            let Some(fd) = slot.take() else {
                return neg(libc::EADDRINUSE);
            };
            (fd, addr, Some(port))
        };
        let sock = table.socks[s].as_mut().expect("checked");
        if let Kind::Datagram(d) = &mut sock.kind {
            d.published = published;
        }
        sock.fd = Some(fd);
        sock.local = local;
        0
    }

    /// Whether socket `s` may send to `addr`.
    fn udp_allowed(&self, d: &Dgram, addr: u64) -> bool {
        let (ip, port) = unpack_addr(addr);
        let target = SocketAddrV4::new(Ipv4Addr::from(ip), port);
        self.config.allow_connect_udp.contains(&target) || d.heard.contains(&addr)
    }

    /// An unbound UDP socket is bound as Linux does it on first use: a port of the pool.
    fn udp_autobind(&self, table: &mut Table, s: usize) -> Option<u64> {
        if table.socks[s].as_ref().is_some_and(|k| k.fd.is_none()) {
            let r = self.udp_bind(table, s, 0);
            if r != 0 {
                return Some(r);
            }
        }
        None
    }

    /// The UDP operations (`NET_OP_UDP_*`); `Err` is a protocol violation.
    pub(super) fn udp_call(
        &self,
        ram: &GuestRam,
        image_start: u64,
        table: &mut Table,
        s: usize,
        op: u64,
        args: [u64; 4],
    ) -> Result<u64, String> {
        if !matches!(
            table.socks[s].as_ref().map(|k| &k.kind),
            Some(Kind::Datagram(_))
        ) {
            return Ok(neg(libc::EINVAL));
        }
        if op == NET_OP_UDP_CONNECT {
            return Ok(self.udp_connect(table, s, args[1]));
        }
        let [_, gpa, len_tag, a3] = args;
        let (len, tag) = (len_tag & 0xffff_ffff, len_tag >> 32);
        if op == NET_OP_UDP_SENDTO && len > NET_UDP_MAX {
            return Ok(neg(libc::EMSGSIZE));
        }
        let len = len.min(NET_UDP_MAX);
        let end = gpa.checked_add(len).filter(|&e| e <= ram.size());
        if end.is_none() || gpa < image_start {
            return Err(format!("buffer {gpa:#x}+{len} is not in guest RAM"));
        }
        let host = (ram.host_base() + gpa) as *mut libc::c_void;
        if op == NET_OP_UDP_SENDTO {
            return self.udp_sendto(table, s, host, len, tag, a3);
        }
        let peer_gpa = a3;
        if peer_gpa != 0
            && (peer_gpa < image_start || peer_gpa.checked_add(8).is_none_or(|e| e > ram.size()))
        {
            return Err(format!("peer address {peer_gpa:#x} is not in guest RAM"));
        }
        let sock = table.socks[s].as_mut().expect("checked");
        let Some(fd) = &sock.fd else {
            return Ok(neg(libc::EINVAL));
        };
        let flags = if op == NET_OP_UDP_PEEKFROM {
            libc::MSG_PEEK
        } else {
            0
        };
        let mut sa = zeroed_sockaddr();
        let mut sa_len = SOCKADDR_LEN;
        // SAFETY: `host..host+len` lies in guest RAM (checked above), mapped for the guest's
        // lifetime; `sa`/`sa_len` are valid out-parameters.
        let r = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                host,
                len as usize,
                flags,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut sa_len,
            )
        };
        if r < 0 {
            let e = errno();
            if e == libc::EAGAIN {
                return self.arm(table, s, tag, true);
            }
            return Ok(neg(e));
        }
        let peer = pack_addr(u32::from_be(sa.sin_addr.s_addr), u16::from_be(sa.sin_port));
        if let Kind::Datagram(d) = &mut sock.kind {
            if !d.heard.contains(&peer) {
                if d.heard.len() == HEARD {
                    d.heard.pop_front();
                }
                d.heard.push_back(peer);
            }
        }
        if peer_gpa != 0 {
            ram.write_u64(peer_gpa, peer)
                .map_err(|e| format!("recvfrom's peer address: {e}"))?;
        }
        Ok(r as u64)
    }

    fn udp_sendto(
        &self,
        table: &mut Table,
        s: usize,
        host: *mut libc::c_void,
        len: u64,
        tag: u64,
        addr: u64,
    ) -> Result<u64, String> {
        if let Some(e) = self.udp_autobind(table, s) {
            return Ok(e);
        }
        let sock = table.socks[s].as_ref().expect("checked");
        let Kind::Datagram(d) = &sock.kind else {
            return Ok(neg(libc::EINVAL));
        };
        let fd = sock.fd.as_ref().expect("bound").as_raw_fd();
        let r = if addr == 0 {
            if sock.peer == 0 {
                return Ok(neg(libc::EDESTADDRREQ));
            }
            // SAFETY: `host..host+len` lies in guest RAM (checked by the caller), read only.
            unsafe { libc::send(fd, host, len as usize, libc::MSG_NOSIGNAL) }
        } else {
            if !self.udp_allowed(d, addr) {
                return Ok(neg(libc::EACCES));
            }
            let sa = sockaddr(addr);
            // SAFETY: as above; `sa` is a valid sockaddr_in of the given length.
            unsafe {
                libc::sendto(
                    fd,
                    host,
                    len as usize,
                    libc::MSG_NOSIGNAL,
                    (&sa as *const libc::sockaddr_in).cast(),
                    SOCKADDR_LEN,
                )
            }
        };
        if r >= 0 {
            return Ok(r as u64);
        }
        let e = errno();
        if e == libc::EAGAIN {
            return self.arm(table, s, tag, false);
        }
        Ok(neg(e))
    }

    fn udp_connect(&self, table: &mut Table, s: usize, addr: u64) -> u64 {
        let allowed = match &table.socks[s].as_ref().expect("checked").kind {
            Kind::Datagram(d) => self.udp_allowed(d, addr),
            _ => false,
        };
        if !allowed {
            return neg(libc::EACCES);
        }
        if let Some(e) = self.udp_autobind(table, s) {
            return e;
        }
        let sock = table.socks[s].as_mut().expect("checked");
        let fd = sock.fd.as_ref().expect("bound").as_raw_fd();
        let sa = sockaddr(addr);
        // SAFETY: `fd` is a UDP socket this table owns; `sa` is a valid sockaddr_in.
        let r =
            unsafe { libc::connect(fd, (&sa as *const libc::sockaddr_in).cast(), SOCKADDR_LEN) };
        if r < 0 {
            return neg(errno());
        }
        sock.peer = addr;
        0
    }
}

/// A closed guest UDP socket's host socket goes back: to its published port, or emptied and
/// disconnected to the pool.
pub(super) fn release(table: &mut Table, d: &Dgram, fd: OwnedFd, local: u64) {
    if let Some(port) = d.published {
        if let Some(entry) = table.udp.published.get_mut(&port) {
            entry.1 = Some(fd);
        }
        return;
    }
    let mut byte = 0u8;
    // SAFETY: `fd` is a non-blocking UDP socket; a one-byte buffer drops each datagram.
    while unsafe { libc::recv(fd.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, 0) } >= 0 {}
    let mut unspec = zeroed_sockaddr();
    unspec.sin_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: as above; `AF_UNSPEC` dissolves the association, the bound port stays.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&unspec as *const libc::sockaddr_in).cast(),
            SOCKADDR_LEN,
        )
    };
    if r == 0 {
        table.udp.pool.push((fd, local));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Plan, StackSlots};

    fn plan() -> Plan {
        let stacks = StackSlots::new(60 * 1024, Some(40), 64 << 20).unwrap();
        Plan::new(
            1,
            64 << 20,
            0x20_0000..0x30_0000,
            0x20_0100,
            16,
            0x20_0000,
            stacks,
        )
        .unwrap()
    }

    fn packed(addr: std::net::SocketAddr) -> u64 {
        let std::net::SocketAddr::V4(a) = addr else {
            panic!("IPv4")
        };
        pack_addr(u32::from(*a.ip()), a.port())
    }

    #[test]
    fn datagrams_are_checked_truncated_and_allowed_only_where_told() {
        let (plan, ram) = (plan(), GuestRam::new(64 << 20).unwrap());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer_addr = packed(peer.local_addr().unwrap());
        let config = NetConfig {
            allow_connect_udp: vec![match peer.local_addr().unwrap() {
                std::net::SocketAddr::V4(a) => a,
                _ => unreachable!(),
            }],
            ..NetConfig::default()
        };
        let net = Net::open(&config).unwrap();
        let call = |op, s: u64, a1, a2, a3| net.call(&ram, &plan, [net_arg(op, s), a1, a2, a3]);
        let udp = call(NET_OP_SOCKET, 0, NET_KIND_UDP, 0, 0).unwrap();
        let tcp = call(NET_OP_SOCKET, 0, NET_KIND_TCP, 0, 0).unwrap();
        let buf = 0x40_0000u64;
        let no_wait = NET_NO_WAIT << 32;
        assert_eq!(call(NET_OP_BIND, udp, 0, 0, 0), Ok(0));
        let (ip, port) = unpack_addr(call(NET_OP_SOCKNAME, udp, 0, 0, 0).unwrap());
        assert_eq!((ip, port != 0), (0x7f00_0001, true));
        // Kinds, sizes and guest addresses.
        let sendto = NET_OP_UDP_SENDTO;
        assert_eq!(
            call(sendto, tcp, buf, 4 | no_wait, peer_addr),
            Ok(neg(libc::EINVAL))
        );
        let too_big = (NET_UDP_MAX + 1) | no_wait;
        assert_eq!(
            call(sendto, udp, buf, too_big, peer_addr),
            Ok(neg(libc::EMSGSIZE))
        );
        assert!(call(sendto, udp, (64 << 20) - 2, 4 | no_wait, peer_addr).is_err());
        assert!(call(sendto, udp, 0x1000, 4 | no_wait, peer_addr).is_err());
        let elsewhere = pack_addr(0x7f00_0001, 9);
        assert_eq!(
            call(sendto, udp, buf, 4 | no_wait, elsewhere),
            Ok(neg(libc::EACCES))
        );
        assert_eq!(
            call(sendto, udp, buf, 4 | no_wait, 0),
            Ok(neg(libc::EDESTADDRREQ))
        );
        ram.write_bytes(buf, b"ping").unwrap();
        assert_eq!(call(sendto, udp, buf, 4 | no_wait, peer_addr), Ok(4));
        let mut got = [0u8; 16];
        let (n, from) = peer.recv_from(&mut got).unwrap();
        assert_eq!(
            (&got[..n], packed(from)),
            (&b"ping"[..], pack_addr(ip, port))
        );
        // A datagram larger than the buffer: truncated, the rest dropped.
        peer.send_to(b"0123456789", from).unwrap();
        peer.send_to(b"next", from).unwrap();
        let recv = NET_OP_UDP_RECVFROM;
        let out = buf + 64;
        assert!(call(recv, udp, buf, 4 | no_wait, 0x1000).is_err());
        assert!(call(recv, udp, buf, 4 | no_wait, (64 << 20) - 4).is_err());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(call(NET_OP_UDP_PEEKFROM, udp, buf, 2 | no_wait, out), Ok(2));
        assert_eq!(call(recv, udp, buf, 4 | no_wait, out), Ok(4));
        assert_eq!(ram.read_bytes(buf, 4).unwrap(), b"0123");
        assert_eq!(ram.read_u64(out).unwrap(), peer_addr);
        assert_eq!(call(recv, udp, buf, 16 | no_wait, 0), Ok(4));
        assert_eq!(ram.read_bytes(buf, 4).unwrap(), b"next");
        assert_eq!(call(recv, udp, buf, 16 | no_wait, 0), Ok(neg(libc::EAGAIN)));
        // poll (24): a bound UDP socket answers; an unbound one has no host socket.
        let poll = |s, events| call(NET_OP_POLL, s, events, NET_NO_WAIT, 0);
        assert_eq!(poll(udp, NET_READABLE), Ok(neg(libc::EAGAIN)));
        assert_eq!(poll(udp, NET_WRITABLE), Ok(NET_WRITABLE));
        peer.send_to(b"ready", from).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(poll(udp, NET_READABLE), Ok(NET_READABLE));
        assert_eq!(call(recv, udp, buf, 16 | no_wait, 0), Ok(5));
        let unbound = call(NET_OP_SOCKET, 0, NET_KIND_UDP, 0, 0).unwrap();
        assert_eq!(poll(unbound, NET_WRITABLE), Ok(neg(libc::ENOTCONN)));
        assert_eq!(call(NET_OP_CLOSE, unbound, 0, 0, 0), Ok(0));
        // connect: the default peer.
        assert_eq!(
            call(NET_OP_UDP_CONNECT, udp, elsewhere, 0, 0),
            Ok(neg(libc::EACCES))
        );
        assert_eq!(call(NET_OP_UDP_CONNECT, udp, peer_addr, 0, 0), Ok(0));
        assert_eq!(call(NET_OP_PEERNAME, udp, 0, 0, 0), Ok(peer_addr));
        assert_eq!(call(sendto, udp, buf, 4 | no_wait, 0), Ok(4));
        assert_eq!(peer.recv(&mut got).unwrap(), 4);
        // TCP's operations refuse a UDP socket; close gives the port back to the pool.
        assert_eq!(call(NET_OP_LISTEN, udp, 1, 0, 0), Ok(neg(libc::EINVAL)));
        assert_eq!(
            call(NET_OP_CONNECT, udp, peer_addr, NET_NO_WAIT, 0),
            Ok(neg(libc::EINVAL))
        );
        assert_eq!(call(NET_OP_CLOSE, udp, 0, 0, 0), Ok(0));
        assert_eq!(net.lock().udp.pool.len(), POOL);
    }
}
