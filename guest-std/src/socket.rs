//! Sockets (`std::net` TCP, IPv4): hermit-abi's `sys_socket` ... `sys_shutdown` on the VMM's
//! socket proxy (`protocol::net`). A socket's descriptor is [`SOCKET_FD_BASE`] plus the
//! VMM's socket number. A call that would block parks the calling thread in activm-rt
//! (`activm_rt::net::call`) until the VMM reports the host socket ready, unless the socket is
//! non-blocking (`set_nonblocking`: `-EAGAIN`). Errors are the VMM's Linux errno values; what
//! the guest may reach is the VMM's decision (`--publish`, `--allow-connect`; else `EACCES`).
//! UDP sockets (`SOCK_DGRAM`) branch off to `socket_udp.rs` at the top of each call.

use activm_stub::protocol::net::*;

use crate::errno::{fail, EBADF, EINVAL};
use crate::socket_call::{net, nonblocking, set_nonblocking, waiting, waiting_until};
use crate::socket_udp::{self as udp, is_udp};
use crate::socket_v6 as v6;

pub use crate::socket_dup::SOCKET_FD_BASE;

const EAFNOSUPPORT: i32 = 97;
/// hermit-abi's `IPPROTO_IPV6` and `IPV6_V6ONLY`.
const IPPROTO_IPV6: i32 = 41;
const IPV6_V6ONLY: i32 = 27;
const EPROTONOSUPPORT: i32 = 93;
const ENOPROTOOPT: i32 = 92;

/// hermit-abi's constants (`hermit_abi::AF_INET` ...), which differ from Linux's.
const AF_INET: i32 = 3;
const SOCK_STREAM: i32 = 1;
const SOCK_DGRAM: i32 = 2;
const SOCK_NONBLOCK: i32 = 0o4000;
const IPPROTO_TCP: i32 = 6;
const TCP_NODELAY: i32 = 1;
const SOL_SOCKET: i32 = 4095;
const SO_ERROR: i32 = 0x1007;
use crate::socket_timeout::{SO_RCVTIMEO, SO_SNDTIMEO};
const MSG_PEEK: i32 = 1;
const FIONBIO: i32 = 0x8008667eu32 as i32;

/// hermit-abi's `sockaddr_in` (BSD layout: a length byte, then the family byte).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockaddrIn {
    len: u8,
    family: u8,
    port_be: u16,
    addr_be: u32,
    zero: [u8; 8],
}

/// Whether `fd` lies in the socket descriptors' range (copies from `dup` included).
pub fn is_socket(fd: i32) -> bool {
    crate::socket_dup::in_range(fd)
}

fn number(fd: i32) -> Option<u64> {
    crate::socket_dup::resolve(fd)
}

/// The socket number descriptor `fd` names (`None`: not an open socket descriptor).
pub fn socket_number(fd: i32) -> Option<u64> {
    number(fd)
}

/// `-errno` results become the thread's `errno` too.
fn done(r: i64) -> i64 {
    if (-4095..0).contains(&r) {
        fail(-r as i32) as i64
    } else {
        r
    }
}

fn read_addr(name: *const u8, len: u32) -> Result<u64, i32> {
    if name.is_null() || len < 2 {
        return Err(EINVAL);
    }
    // SAFETY: at least two readable bytes; the family is the second (BSD layout).
    if i32::from(unsafe { name.add(1).read() }) == v6::AF_INET6 {
        let (ip, port) = v6::read(name, len)?;
        return Ok(pack_addr(ip, port));
    }
    if (len as usize) < core::mem::size_of::<SockaddrIn>() {
        return Err(EINVAL);
    }
    // SAFETY: the caller passes `len` readable bytes, at least a sockaddr_in.
    let sa = unsafe { core::ptr::read_unaligned(name.cast::<SockaddrIn>()) };
    if i32::from(sa.family) != AF_INET {
        return Err(EAFNOSUPPORT);
    }
    Ok(pack_addr(
        u32::from_be(sa.addr_be),
        u16::from_be(sa.port_be),
    ))
}

/// Writes address `packed` for socket `s`: a `sockaddr_in`, or a `sockaddr_in6` for a socket
/// made with `AF_INET6`.
fn write_addr(s: u64, packed: u64, name: *mut u8, namelen: *mut u32) {
    if name.is_null() || namelen.is_null() {
        return;
    }
    let (ip, port) = unpack_addr(packed);
    if v6::is_v6(s) {
        v6::write(ip, port, name, namelen);
        return;
    }
    let sa = SockaddrIn {
        len: core::mem::size_of::<SockaddrIn>() as u8,
        family: AF_INET as u8,
        port_be: port.to_be(),
        addr_be: ip.to_be(),
        zero: [0; 8],
    };
    // SAFETY: the caller passes `*namelen` writable bytes at `name`.
    unsafe {
        let room = (*namelen as usize).min(core::mem::size_of::<SockaddrIn>());
        core::ptr::copy_nonoverlapping((&sa as *const SockaddrIn).cast::<u8>(), name, room);
        *namelen = core::mem::size_of::<SockaddrIn>() as u32;
    }
}

macro_rules! socket_or_ebadf {
    ($fd:expr) => {
        match number($fd) {
            Some(s) => s,
            None => return fail(EBADF) as _,
        }
    };
}

/// `int sys_network_init(void)`: nothing to do (the VMM's sockets are there).
#[unsafe(no_mangle)]
pub extern "C" fn sys_network_init() -> i32 {
    0
}

/// `int sys_socket(int domain, int type, int protocol)`: TCP and UDP, IPv4 (and IPv6 as a view
/// of IPv4 loopback: `socket_v6`).
#[unsafe(no_mangle)]
pub extern "C" fn sys_socket(domain: i32, kind: i32, _protocol: i32) -> i32 {
    if domain != AF_INET && domain != v6::AF_INET6 {
        return fail(EAFNOSUPPORT);
    }
    if kind & 0xf == SOCK_DGRAM {
        let r = done(udp::socket(kind & SOCK_NONBLOCK != 0));
        return if r < 0 {
            r as i32
        } else {
            v6::set_family(r as u64, domain == v6::AF_INET6);
            SOCKET_FD_BASE + r as i32
        };
    }
    if kind & 0xf != SOCK_STREAM {
        return fail(EPROTONOSUPPORT);
    }
    let r = done(net(NET_OP_SOCKET, 0, NET_KIND_TCP, 0, 0));
    if r < 0 {
        return r as i32;
    }
    set_nonblocking(r as u64, kind & SOCK_NONBLOCK != 0);
    crate::socket_timeout::reset(r as u64);
    v6::set_family(r as u64, domain == v6::AF_INET6);
    SOCKET_FD_BASE + r as i32
}

/// `int sys_bind(int s, const sockaddr *name, socklen_t namelen)`.
///
/// # Safety
/// `name` points to `namelen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_bind(fd: i32, name: *const u8, namelen: u32) -> i32 {
    let s = socket_or_ebadf!(fd);
    match read_addr(name, namelen) {
        Ok(addr) => done(net(NET_OP_BIND, s, addr, 0, 0)) as i32,
        Err(e) => fail(e),
    }
}

/// `int sys_listen(int s, int backlog)`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_listen(fd: i32, backlog: i32) -> i32 {
    let s = socket_or_ebadf!(fd);
    done(net(NET_OP_LISTEN, s, backlog as u64, 0, 0)) as i32
}

/// `int sys_accept(int s, sockaddr *addr, socklen_t *addrlen)`: waits for a connection.
///
/// # Safety
/// `addr`/`addrlen` are null or writable as usual.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_accept(fd: i32, addr: *mut u8, addrlen: *mut u32) -> i32 {
    let s = socket_or_ebadf!(fd);
    let mut peer = 0u64;
    let peer_gpa = &mut peer as *mut u64 as u64;
    let area = crate::socket_rx::new_area();
    let deadline = crate::socket_timeout::deadline(s, true);
    let r = done(waiting_until(
        s,
        |tag| net(NET_OP_ACCEPT, s, tag, peer_gpa, area as u64),
        deadline,
    ));
    if r < 0 {
        // SAFETY: no socket took the buffer.
        unsafe { crate::socket_rx::free_area(area) };
        return r as i32;
    }
    if !area.is_null() {
        crate::socket_rx::attach(r as u64, area);
    }
    crate::socket_tx::set_up(r as u64);
    set_nonblocking(r as u64, false);
    crate::socket_timeout::reset(r as u64);
    v6::set_family(r as u64, v6::is_v6(s));
    write_addr(r as u64, peer, addr, addrlen);
    SOCKET_FD_BASE + r as i32
}

/// `int sys_connect(int s, const sockaddr *name, socklen_t namelen)`: waits until connected.
///
/// # Safety
/// `name` points to `namelen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_connect(fd: i32, name: *const u8, namelen: u32) -> i32 {
    let s = socket_or_ebadf!(fd);
    if is_udp(s) {
        return match read_addr(name, namelen) {
            Ok(addr) => done(udp::connect(s, addr)) as i32,
            Err(e) => fail(e),
        };
    }
    let r = match read_addr(name, namelen) {
        Ok(addr) => waiting(s, |tag| net(NET_OP_CONNECT, s, addr, tag, 0)),
        Err(e) => return fail(e),
    };
    if r == -11 && nonblocking(s) {
        // Under way: `poll(POLLOUT)` says when (std's `connect_timeout`).
        return crate::socket_poll::connect_started(s);
    }
    let r = done(r) as i32;
    if r == 0 {
        crate::socket_rx::set_up(s);
        crate::socket_tx::set_up(s);
    }
    r
}

/// `isize sys_recv(int s, u8 *buf, usize len, int flags)`: `MSG_PEEK` only.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_recv(fd: i32, buf: *mut u8, len: usize, flags: i32) -> isize {
    let s = socket_or_ebadf!(fd);
    if is_udp(s) {
        let mut peer = 0;
        // SAFETY: the caller's contract.
        return done(unsafe { udp::recv_from(s, buf, len, flags & MSG_PEEK != 0, &mut peer) })
            as isize;
    }
    let deadline = crate::socket_timeout::deadline(s, true);
    let peeking = flags & MSG_PEEK != 0;
    // SAFETY: the caller's contract.
    let buffered =
        unsafe { crate::socket_rx::recv(s, buf, len, peeking, nonblocking(s), deadline) };
    if let Some(r) = buffered {
        return done(r) as isize;
    }
    let peek = if flags & MSG_PEEK != 0 {
        NET_MSG_PEEK << 32
    } else {
        0
    };
    done(waiting_until(
        s,
        |tag| net(NET_OP_RECV, s, buf as u64, len as u64, tag | peek),
        deadline,
    )) as isize
}

/// `isize sys_recvfrom(...)`: `sys_recv`, with the peer's address.
///
/// # Safety
/// As `sys_recv`; `addr`/`addrlen` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_recvfrom(
    fd: i32,
    buf: *mut u8,
    len: usize,
    flags: i32,
    addr: *mut u8,
    addrlen: *mut u32,
) -> isize {
    if let Some(s) = number(fd).filter(|&s| is_udp(s)) {
        let mut peer = 0;
        // SAFETY: the caller's contract.
        let r = done(unsafe { udp::recv_from(s, buf, len, flags & MSG_PEEK != 0, &mut peer) });
        if r >= 0 {
            write_addr(s, peer, addr, addrlen);
        }
        return r as isize;
    }
    // SAFETY: the caller's contract.
    let r = unsafe { sys_recv(fd, buf, len, flags) };
    if r >= 0 {
        // SAFETY: the caller's contract.
        unsafe { sys_getpeername(fd, addr, addrlen) };
    }
    r
}

/// `isize sys_send(int s, const void *mem, usize len, int flags)`.
///
/// # Safety
/// `mem` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_send(fd: i32, mem: *const u8, len: usize, _flags: i32) -> isize {
    let s = socket_or_ebadf!(fd);
    if is_udp(s) {
        // SAFETY: the caller's contract.
        return done(unsafe { udp::send_to(s, mem, len, 0) }) as isize;
    }
    let deadline = crate::socket_timeout::deadline(s, false);
    // SAFETY: the caller's contract.
    if let Some(r) = unsafe { crate::socket_tx::send(s, mem, len, nonblocking(s), deadline) } {
        return done(r) as isize;
    }
    done(waiting_until(
        s,
        |tag| net(NET_OP_SEND, s, mem as u64, len as u64, tag),
        deadline,
    )) as isize
}

/// `isize sys_sendto(...)`: a UDP datagram to `to` (null: the connected peer); on a TCP
/// socket `sys_send`.
///
/// # Safety
/// As `sys_send`; `to` null or `tolen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_sendto(
    fd: i32,
    mem: *const u8,
    len: usize,
    flags: i32,
    to: *const u8,
    tolen: u32,
) -> isize {
    if let Some(s) = number(fd).filter(|&s| is_udp(s)) {
        let addr = match to.is_null() {
            true => 0,
            false => match read_addr(to, tolen) {
                Ok(addr) => addr,
                Err(e) => return fail(e) as isize,
            },
        };
        // SAFETY: the caller's contract.
        return done(unsafe { udp::send_to(s, mem, len, addr) }) as isize;
    }
    // SAFETY: the caller's contract.
    unsafe { sys_send(fd, mem, len, flags) }
}

/// `int sys_shutdown(int s, int how)`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_shutdown(fd: i32, how: i32) -> i32 {
    let s = socket_or_ebadf!(fd);
    if how != 0 {
        // Queued bytes go out before the write side closes.
        crate::socket_tx::drain(s);
    }
    done(net(NET_OP_SHUTDOWN, s, how as u64, 0, 0)) as i32
}

/// `int sys_shutdown_socket(int s, int how)`: the old name of `sys_shutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_shutdown_socket(fd: i32, how: i32) -> i32 {
    sys_shutdown(fd, how)
}

/// Closes socket `fd` (`sys_close` of a socket descriptor).
pub fn close(fd: i32) -> i32 {
    let s = socket_or_ebadf!(fd);
    if !crate::socket_dup::release(fd, s) {
        return 0; // another descriptor still names the socket
    }
    if is_udp(s) {
        return done(udp::close(s)) as i32;
    }
    if !nonblocking(s) {
        // A non-blocking close returns at once: the VMM sends what is left after it.
        crate::socket_tx::drain(s);
    }
    // Detached first: once the VMM closed it, an `accept` may reuse the number at once.
    let area = crate::socket_rx::detach(s);
    let tx = crate::socket_tx::detach(s);
    crate::socket_poll::forget(s);
    let r = done(net(NET_OP_CLOSE, s, 0, 0, 0)) as i32;
    if r == 0 {
        // SAFETY: the VMM closed the socket: it uses its buffer and ring no more.
        unsafe {
            crate::socket_rx::free_area(area);
            crate::socket_tx::free_area(tx);
        }
    } else {
        if !area.is_null() {
            crate::socket_rx::attach(s, area);
        }
        if !tx.is_null() {
            crate::socket_tx::attach(s, tx);
        }
    }
    r
}

fn name_of(op: u64, fd: i32, name: *mut u8, namelen: *mut u32) -> i32 {
    let s = socket_or_ebadf!(fd);
    let r = net(op, s, 0, 0, 0);
    if (-4095..0).contains(&r) {
        return done(r) as i32;
    }
    write_addr(s, r as u64, name, namelen);
    0
}

/// `int sys_getpeername(int s, sockaddr *name, socklen_t *namelen)`.
///
/// # Safety
/// `name`/`namelen` writable as usual.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_getpeername(fd: i32, name: *mut u8, namelen: *mut u32) -> i32 {
    name_of(NET_OP_PEERNAME, fd, name, namelen)
}

/// `int sys_getsockname(int s, sockaddr *name, socklen_t *namelen)`.
///
/// # Safety
/// `name`/`namelen` writable as usual.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_getsockname(fd: i32, name: *mut u8, namelen: *mut u32) -> i32 {
    name_of(NET_OP_SOCKNAME, fd, name, namelen)
}

/// `int sys_setsockopt(int s, int level, int optname, const void *optval, socklen_t optlen)`:
/// `TCP_NODELAY`; `SO_RCVTIMEO`/`SO_SNDTIMEO` (`socket_timeout`); other `SOL_SOCKET` options
/// are accepted and ignored.
///
/// # Safety
/// `optval` points to `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_setsockopt(
    fd: i32,
    level: i32,
    optname: i32,
    optval: *const u8,
    optlen: u32,
) -> i32 {
    let s = socket_or_ebadf!(fd);
    if optval.is_null() || optlen < 4 {
        return fail(EINVAL);
    }
    // SAFETY: at least 4 readable bytes (checked above).
    let first = unsafe { core::ptr::read_unaligned(optval.cast::<i32>()) };
    match (level, optname) {
        (IPPROTO_TCP, TCP_NODELAY) => {
            done(net(NET_OP_SETOPT, s, NET_OPT_NODELAY, first as u64, 0)) as i32
        }
        (SOL_SOCKET, SO_RCVTIMEO | SO_SNDTIMEO) => {
            // SAFETY: `optlen` readable bytes at `optval` (the caller's contract).
            let set = unsafe { crate::socket_timeout::set(s, optname, optval, optlen) };
            match set {
                Ok(()) => 0,
                Err(e) => fail(e),
            }
        }
        (SOL_SOCKET, _) => 0,
        // An IPv6 socket here is a view of IPv4 loopback, so always dual-stack: `IPV6_V6ONLY`
        // off is what it is; on cannot be had.
        (IPPROTO_IPV6, IPV6_V6ONLY) if v6::is_v6(s) && first == 0 => 0,
        _ => fail(ENOPROTOOPT),
    }
}

/// `int sys_getsockopt(int s, int level, int optname, void *optval, socklen_t *optlen)`.
///
/// # Safety
/// `optval` points to `*optlen` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_getsockopt(
    fd: i32,
    level: i32,
    optname: i32,
    optval: *mut u8,
    optlen: *mut u32,
) -> i32 {
    let s = socket_or_ebadf!(fd);
    if optval.is_null() || optlen.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's contract.
    let room = unsafe { *optlen } as usize;
    let value = match (level, optname) {
        (IPPROTO_TCP, TCP_NODELAY) => net(NET_OP_GETOPT, s, NET_OPT_NODELAY, 0, 0),
        (SOL_SOCKET, SO_ERROR) => net(NET_OP_GETOPT, s, NET_OPT_ERROR, 0, 0),
        (SOL_SOCKET, SO_RCVTIMEO | SO_SNDTIMEO) => {
            // SAFETY: `room` writable bytes at `optval`.
            let n = unsafe { crate::socket_timeout::get(s, optname, optval, room) };
            // SAFETY: the caller's `optlen`.
            unsafe { *optlen = n as u32 };
            return 0;
        }
        _ => return fail(ENOPROTOOPT),
    };
    if value < 0 {
        return done(value) as i32;
    }
    // SAFETY: `room` writable bytes at `optval`; a timeval of zeroes for timeouts.
    unsafe {
        core::ptr::write_bytes(optval, 0, room);
        if room >= 4 {
            core::ptr::write_unaligned(optval.cast::<i32>(), value as i32);
        }
    }
    0
}

/// `ioctl(FIONBIO)` on a socket; `None` for other descriptors.
///
/// # Safety
/// `argp` is null or points to an `int` (`FIONBIO`).
pub unsafe fn ioctl(fd: i32, cmd: i32, argp: *const u8) -> Option<i32> {
    let s = number(fd)?;
    if cmd != FIONBIO || argp.is_null() {
        return Some(fail(EINVAL));
    }
    // SAFETY: FIONBIO's argument is an int.
    let on = unsafe { core::ptr::read_unaligned(argp.cast::<i32>()) } != 0;
    set_nonblocking(s, on);
    Some(0)
}
