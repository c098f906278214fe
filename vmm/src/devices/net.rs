//! Sockets for the guest through host sockets (`protocol::net`): a socket proxy.
//!
//! The guest names sockets by their index in a bounded per-guest table
//! (`NET_MAX_SOCKETS`); the VMM owns a non-blocking host socket behind each. Nothing is
//! reachable by default: a guest may bind only a port published with
//! `--publish HOSTPORT:GUESTPORT`, whose host listener on `127.0.0.1:HOSTPORT` is created
//! before the sandbox closes (so the vCPU threads never call `socket`/`bind`/`listen` for
//! it), and connect only to the loopback addresses given with `--allow-connect`. Anything
//! else is `EACCES`.
//!
//! Waiting holds no processor: an operation that would block arms a one-shot epoll
//! registration under the guest's tag and returns `NET_WAITING`; the guest's thread parks in
//! its own scheduler. The guest's **net thread** waits in `epoll_wait`, posts `(tag, events)`
//! into the guest's `NetRing` and interrupts one idle vCPU (`SharedHeader::idle_vcpus`),
//! like block completions (`blk_async.rs`).

use std::collections::HashMap;
use std::io;
use std::mem::offset_of;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

use protocol::net::*;

use crate::memory::{GuestRam, Plan};

mod byte_ring;
mod linger;
mod opts;
mod poll;
mod rx;
pub mod thread;
mod tx;
mod udp;
mod unseen;
mod waits;
use crate::config::NetConfig;
use opts::{so_error, sockopt};
use poll::{epoll_update, post};
use rx::RxArea;
#[cfg(feature = "fuzzing")]
pub use tx::TxArea;
#[cfg(not(feature = "fuzzing"))]
use tx::TxArea;

#[derive(Debug)]
enum Kind {
    /// Created, not bound or connected yet (no host socket).
    Fresh,
    /// Bound to a published guest port; the host listener after `listen`.
    Listener { guest_port: u16, listening: bool },
    /// A non-blocking connect in progress or done.
    Stream,
    /// A UDP socket (`udp.rs`); its host socket once bound.
    Datagram(udp::Dgram),
}

#[derive(Debug)]
struct Sock {
    kind: Kind,
    fd: Option<OwnedFd>,
    generation: u32,
    local: u64,
    peer: u64,
    read_tag: Option<u32>,
    write_tag: Option<u32>,
    in_epoll: bool,
    /// The events last registered in epoll (`poll::epoll_update`).
    registered: u32,
    /// The guest's receive buffer (`rx_setup`, or given to `accept`).
    rx: Option<RxArea>,
    /// The guest's transmit ring (`tx_setup`).
    tx: Option<TxArea>,
}

#[derive(Debug, Default)]
struct Table {
    socks: Vec<Option<Sock>>,
    generation: u32,
    /// Published listeners not bound by the guest, by guest port: (host port, listener).
    listeners: HashMap<u16, (u16, Option<OwnedFd>)>,
    ring: Option<u64>,
    head: u32,
    /// Tags armed in epoll, one bit each.
    waiting: [u64; NET_RING_CAPACITY / 64],
    /// Sockets with a transmit ring, for the net thread's looks.
    tx_socks: Vec<usize>,
    /// Closed streams whose last bytes are still being sent.
    lingering: linger::Lingering,
    /// Host UDP sockets no guest socket holds.
    udp: udp::UdpPorts,
}

/// A guest's sockets.
#[derive(Debug)]
pub struct Net {
    config: NetConfig,
    table: Mutex<Table>,
    epoll: OwnedFd,
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn neg(errno: i32) -> u64 {
    (-(errno as i64)) as u64
}

/// Per-call cap on recv/send lengths.
const MAX_IO: u64 = 1 << 20;

impl Net {
    /// Binds the published listeners (before the sandbox) and makes the epoll instance.
    pub fn open(config: &NetConfig) -> io::Result<Net> {
        let mut table = Table {
            udp: udp::open_ports(config)?,
            ..Table::default()
        };
        for &(host, guest) in &config.publish {
            let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, host))
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("--publish {host}:{guest}: cannot listen on 127.0.0.1:{host}: {e}"),
                    )
                })?;
            listener.set_nonblocking(true)?;
            let fd = OwnedFd::from(listener);
            if table.listeners.insert(guest, (host, Some(fd))).is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("guest port {guest} is published twice"),
                ));
            }
        }
        // SAFETY: plain system call; the result is checked before it becomes an OwnedFd.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `epoll` is a new descriptor owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        Ok(Net {
            config: config.clone(),
            table: Mutex::new(table),
            epoll,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `net_ring_setup(gpa)`: `Err` is a protocol violation.
    pub fn setup(&self, ram: &GuestRam, plan: &Plan, gpa: u64) -> Result<u64, String> {
        let size = std::mem::size_of::<NetRing>() as u64;
        let inside = gpa >= plan.image.start
            && gpa
                .checked_add(size)
                .is_some_and(|end| end <= plan.mem_size);
        if !inside || !gpa.is_multiple_of(64) {
            return Err(format!(
                "net ring {gpa:#x}+{size} is not 64-byte aligned in guest RAM at or above {:#x}",
                plan.image.start
            ));
        }
        let mut table = self.lock();
        if table.ring.is_some() {
            return Err("the net ring is set up already".into());
        }
        ram.write_u32(gpa + offset_of!(NetRing, head) as u64, 0)
            .map_err(|e| e.to_string())?;
        table.ring = Some(gpa);
        Ok(0)
    }

    /// The transmit doorbell's store, taken by a vCPU's thread: send what every ring holds (the
    /// caller then publishes, `thread::after_call`). `Err` is a protocol violation.
    pub fn ring_doorbell(&self, ram: &GuestRam) -> Result<(), String> {
        self.send_all_queued(ram, &mut self.lock())?;
        Ok(())
    }

    /// `net(op << 32 | socket, a1, a2, a3)`: the result, or `Err` for a protocol violation.
    pub fn call(&self, ram: &GuestRam, plan: &Plan, args: [u64; 4]) -> Result<u64, String> {
        let image_start = plan.image.start;
        let op = args[0] >> 32;
        let s = (args[0] & 0xffff_ffff) as usize;
        let mut table = self.lock();
        if op == NET_OP_SOCKET {
            return Ok(self.socket(&mut table, args[1]));
        }
        if op == NET_OP_TX_FLUSH_ALL {
            self.send_all_queued(ram, &mut table)?;
            return Ok(0);
        }
        if !matches!(table.socks.get(s), Some(Some(_))) {
            return Ok(neg(libc::EBADF));
        }
        let result = match op {
            NET_OP_BIND if is_datagram(&table, s) => self.udp_bind(&mut table, s, args[1]),
            NET_OP_BIND => self.bind(&mut table, s, args[1]),
            NET_OP_UDP_SENDTO..=NET_OP_UDP_CONNECT => {
                self.udp_call(ram, image_start, &mut table, s, op, args)?
            }
            NET_OP_LISTEN => listen(&mut table, s),
            NET_OP_ACCEPT => self.accept(ram, image_start, &mut table, s, args)?,
            NET_OP_RX_SETUP => self.rx_setup(ram, image_start, &mut table, s, args[1])?,
            NET_OP_RX_RESUME => self.rx_resume(ram, &mut table, s)?,
            NET_OP_TX_SETUP => self.tx_setup(ram, image_start, &mut table, s, args[1])?,
            NET_OP_TX_FLUSH => self.tx_flush(ram, &mut table, s, args[1])?,
            NET_OP_CONNECT => self.connect(&mut table, s, args[1], args[2])?,
            NET_OP_RECV | NET_OP_SEND => {
                self.transfer(ram, image_start, &mut table, s, op, args)?
            }
            NET_OP_SHUTDOWN => with_fd(&table, s, |fd| {
                let how = match args[1] {
                    0 => libc::SHUT_RD,
                    1 => libc::SHUT_WR,
                    2 => libc::SHUT_RDWR,
                    _ => return neg(libc::EINVAL),
                };
                // SAFETY: `fd` is a socket this table owns.
                syscall_result(unsafe { libc::shutdown(fd, how) } as i64)
            }),
            NET_OP_CLOSE => self.close(ram, &mut table, s)?,
            NET_OP_SOCKNAME => table.socks[s].as_ref().map_or(0, |k| k.local),
            NET_OP_PEERNAME => match table.socks[s].as_ref().map_or(0, |k| k.peer) {
                0 => neg(libc::ENOTCONN),
                peer => peer,
            },
            NET_OP_SETOPT | NET_OP_GETOPT => sockopt(&table, s, op, args[1], args[2]),
            NET_OP_POLL => self.poll(&mut table, s, args[1], args[2])?,
            NET_OP_CANCEL => self.cancel(&mut table, s, args[1])?,
            _ => return Err(format!("unknown net operation {op}")),
        };
        Ok(result)
    }

    fn socket(&self, table: &mut Table, kind: u64) -> u64 {
        if kind != NET_KIND_TCP && kind != NET_KIND_UDP {
            return neg(libc::EAFNOSUPPORT);
        }
        if self.config.is_empty() {
            return neg(libc::EACCES);
        }
        let free = table.socks.iter().position(Option::is_none);
        let index = match free {
            Some(i) => i,
            None if table.socks.len() < NET_MAX_SOCKETS => {
                table.socks.push(None);
                table.socks.len() - 1
            }
            None => return neg(libc::EMFILE),
        };
        table.generation = table.generation.wrapping_add(1);
        table.socks[index] = Some(Sock {
            kind: match kind {
                NET_KIND_UDP => Kind::Datagram(udp::Dgram::default()),
                _ => Kind::Fresh,
            },
            fd: None,
            generation: table.generation,
            local: 0,
            peer: 0,
            read_tag: None,
            write_tag: None,
            in_epoll: false,
            registered: 0,
            rx: None,
            tx: None,
        });
        index as u64
    }

    fn bind(&self, table: &mut Table, s: usize, addr: u64) -> u64 {
        let (ip, port) = unpack_addr(addr);
        let ip = Ipv4Addr::from(ip);
        if !(ip.is_unspecified() || ip.is_loopback()) {
            return neg(libc::EACCES);
        }
        let Some((_, listener)) = table.listeners.get_mut(&port) else {
            return neg(libc::EACCES);
        };
        let Some(fd) = listener.take() else {
            return neg(libc::EADDRINUSE);
        };
        let sock = table.socks[s].as_mut().expect("checked");
        if !matches!(sock.kind, Kind::Fresh) {
            table.listeners.get_mut(&port).expect("present").1 = Some(fd);
            return neg(libc::EINVAL);
        }
        sock.kind = Kind::Listener {
            guest_port: port,
            listening: false,
        };
        sock.fd = Some(fd);
        sock.local = addr;
        0
    }

    fn accept(
        &self,
        ram: &GuestRam,
        image_start: u64,
        table: &mut Table,
        s: usize,
        args: [u64; 4],
    ) -> Result<u64, String> {
        let [_, tag, peer_gpa, rx_gpa] = args;
        let rx = match rx_gpa {
            0 => None,
            gpa => Some(RxArea::new(ram, image_start, gpa)?),
        };
        let sock = table.socks[s].as_ref().expect("checked");
        let (
            Kind::Listener {
                listening: true, ..
            },
            Some(fd),
        ) = (&sock.kind, &sock.fd)
        else {
            return Ok(neg(libc::EINVAL));
        };
        let fd = fd.as_raw_fd();
        let mut addr: libc::sockaddr_in = zeroed_sockaddr();
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `fd` is a listener this table owns; `addr`/`len` are valid out-parameters.
        let new = unsafe {
            libc::accept4(
                fd,
                (&mut addr as *mut libc::sockaddr_in).cast(),
                &mut len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if new < 0 {
            let e = errno();
            if e == libc::EAGAIN {
                return self.arm(table, s, tag, true);
            }
            return Ok(neg(e));
        }
        // SAFETY: `new` is a fresh descriptor from accept4, owned by nobody else.
        let new = unsafe { OwnedFd::from_raw_fd(new) };
        let peer = pack_addr(
            u32::from_be(addr.sin_addr.s_addr),
            u16::from_be(addr.sin_port),
        );
        let local = table.socks[s].as_ref().map_or(0, |k| k.local);
        let index = self.socket(table, NET_KIND_TCP);
        if index > NET_MAX_SOCKETS as u64 {
            return Ok(index);
        }
        let sock = table.socks[index as usize].as_mut().expect("just made");
        sock.kind = Kind::Stream;
        sock.fd = Some(new);
        sock.peer = peer;
        sock.local = local;
        if let Some(rx) = rx {
            sock.rx = Some(rx);
            let data = (u64::from(sock.generation) << 32) | index;
            if let Err(e) = epoll_update(&self.epoll, sock, data) {
                self.close(ram, table, index as usize)?;
                return Ok(neg(e));
            }
        }
        if peer_gpa != 0 {
            ram.write_u64(peer_gpa, peer)
                .map_err(|e| format!("accept's peer address: {e}"))?;
        }
        Ok(index)
    }

    fn connect(&self, table: &mut Table, s: usize, addr: u64, tag: u64) -> Result<u64, String> {
        let (ip, port) = unpack_addr(addr);
        let target = SocketAddrV4::new(Ipv4Addr::from(ip), port);
        let sock = table.socks[s].as_mut().expect("checked");
        match (&sock.kind, &sock.fd) {
            (Kind::Stream, Some(fd)) => {
                // A retry after the wait: the outcome of the connect.
                let pending = so_error(fd.as_raw_fd());
                return Ok(match pending {
                    0 if sock.peer == addr => 0,
                    0 => neg(libc::EISCONN),
                    e => neg(e),
                });
            }
            (Kind::Fresh, _) => {}
            _ => return Ok(neg(libc::EINVAL)),
        }
        if !self.config.allow_connect.contains(&target) {
            return Ok(neg(libc::EACCES));
        }
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Ok(neg(errno()));
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut sa: libc::sockaddr_in = zeroed_sockaddr();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = ip.to_be();
        // SAFETY: `sa` is a valid sockaddr_in of the given length.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        let e = if r < 0 { errno() } else { 0 };
        if e != 0 && e != libc::EINPROGRESS {
            return Ok(neg(e));
        }
        sock.kind = Kind::Stream;
        sock.fd = Some(fd);
        sock.peer = addr;
        if e == libc::EINPROGRESS {
            return self.arm(table, s, tag, false);
        }
        Ok(0)
    }

    fn transfer(
        &self,
        ram: &GuestRam,
        image_start: u64,
        table: &mut Table,
        s: usize,
        op: u64,
        args: [u64; 4],
    ) -> Result<u64, String> {
        let [_, gpa, len, tag_flags] = args;
        let len = len.min(MAX_IO);
        let end = gpa.checked_add(len).filter(|&e| e <= ram.size());
        if end.is_none() || gpa < image_start {
            return Err(format!("buffer {gpa:#x}+{len} is not in guest RAM"));
        }
        let sock = table.socks[s].as_ref().expect("checked");
        let (Kind::Stream, Some(fd)) = (&sock.kind, &sock.fd) else {
            return Ok(neg(libc::ENOTCONN));
        };
        if (op == NET_OP_RECV && sock.rx.is_some()) || (op == NET_OP_SEND && sock.tx.is_some()) {
            // The bytes go through the receive buffer or transmit ring, in order.
            return Ok(neg(libc::EINVAL));
        }
        let host = (ram.host_base() + gpa) as *mut libc::c_void;
        let r = if op == NET_OP_RECV {
            let flags = if (tag_flags >> 32) & NET_MSG_PEEK != 0 {
                libc::MSG_PEEK
            } else {
                0
            };
            // SAFETY: `host..host+len` lies in guest RAM (checked above), mapped for the
            // guest's lifetime; the guest gave it for this call.
            unsafe { libc::recv(fd.as_raw_fd(), host, len as usize, flags) }
        } else {
            // SAFETY: as above, read only.
            unsafe { libc::send(fd.as_raw_fd(), host, len as usize, libc::MSG_NOSIGNAL) }
        };
        if r >= 0 {
            return Ok(r as u64);
        }
        let e = errno();
        if e == libc::EAGAIN {
            return self.arm(table, s, tag_flags & 0xffff_ffff, op == NET_OP_RECV);
        }
        Ok(neg(e))
    }

    fn close(&self, ram: &GuestRam, table: &mut Table, s: usize) -> Result<u64, String> {
        if matches!(table.socks.get(s), Some(Some(sock)) if sock.tx.is_some()) {
            // What the guest queued last goes out if the host socket takes it.
            self.send_queued(ram, table, s)?;
            table.tx_socks.retain(|&t| t != s);
        }
        let Some(mut sock) = table.socks[s].take() else {
            return Ok(neg(libc::EBADF));
        };
        // What the host socket had no room for yet is sent after the close.
        let unsent = match &mut sock.tx {
            Some(tx) if tx.blocked => tx.take_queued(ram)?,
            _ => Vec::new(),
        };
        let rx_waiter = match &sock.rx {
            Some(rx) => rx.take_waiter(ram)?,
            None => None,
        };
        let tx_waiter = match &sock.tx {
            Some(tx) => tx.take_waiter(ram)?,
            None => None,
        };
        for tag in [sock.read_tag, sock.write_tag, rx_waiter, tx_waiter]
            .into_iter()
            .flatten()
        {
            // The waiter is woken with an error: its socket is gone.
            post(table, tag, NET_ERROR);
        }
        if let Some(fd) = sock.fd {
            if sock.in_epoll {
                // SAFETY: `fd` is registered in this epoll instance; a null event is allowed.
                unsafe {
                    libc::epoll_ctl(
                        self.epoll.as_raw_fd(),
                        libc::EPOLL_CTL_DEL,
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                    )
                };
            }
            if let Kind::Listener { guest_port, .. } = sock.kind {
                // A published listener goes back for the next bind.
                if let Some(entry) = table.listeners.get_mut(&guest_port) {
                    entry.1 = Some(fd);
                }
            } else if let Kind::Datagram(ref d) = sock.kind {
                udp::release(table, d, fd, sock.local);
            } else if !unsent.is_empty() {
                self.linger(table, fd, unsent);
            }
        }
        Ok(0)
    }
}

fn listen(table: &mut Table, s: usize) -> u64 {
    match &mut table.socks[s].as_mut().expect("checked").kind {
        Kind::Listener { listening, .. } => {
            *listening = true;
            0
        }
        _ => neg(libc::EINVAL),
    }
}

fn is_datagram(table: &Table, s: usize) -> bool {
    matches!(
        &table.socks[s],
        Some(Sock {
            kind: Kind::Datagram(_),
            ..
        })
    )
}

fn zeroed_sockaddr() -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

fn syscall_result(r: i64) -> u64 {
    if r < 0 {
        neg(errno())
    } else {
        r as u64
    }
}

fn with_fd(table: &Table, s: usize, f: impl FnOnce(RawFd) -> u64) -> u64 {
    match table.socks[s].as_ref().and_then(|k| k.fd.as_ref()) {
        Some(fd) => f(fd.as_raw_fd()),
        None => neg(libc::ENOTCONN),
    }
}
