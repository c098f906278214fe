//! IPv6 sockets as views of IPv4 loopback. The VMM's socket proxy speaks IPv4 only (a guest
//! reaches nothing but the loopback ports it was given), yet servers commonly bind `[::]` and
//! clients dial `[::1]`. A socket made with `AF_INET6` works as the IPv4 socket underneath, its
//! addresses translated at this boundary: `::` is `0.0.0.0`, `::1` is `127.0.0.1`, and
//! `::ffff:a.b.c.d` is `a.b.c.d`, both ways. Any other IPv6 address is `EACCES`, as an address
//! the exposure rules do not allow.

use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::protocol::net::NET_MAX_SOCKETS;

/// hermit-abi's `AF_INET6`.
pub const AF_INET6: i32 = 1;
const EACCES: i32 = 13;
const EINVAL: i32 = 22;

/// hermit-abi's `sockaddr_in6`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SockaddrIn6 {
    len: u8,
    family: u8,
    port_be: u16,
    flowinfo: u32,
    addr: [u8; 16],
    scope_id: u32,
}

const _: () = assert!(core::mem::size_of::<SockaddrIn6>() == 28);

/// Sockets made with `AF_INET6`, one bit per socket number.
static V6: [AtomicU64; NET_MAX_SOCKETS / 64] = [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

/// Whether socket `s` was made with `AF_INET6` (or accepted from such a listener).
pub fn is_v6(s: u64) -> bool {
    V6[s as usize / 64].load(Ordering::Relaxed) & (1 << (s % 64)) != 0
}

/// Socket `s` was just made (or accepted): note its family. Every new socket passes here, so a
/// reused number never keeps an old socket's bit.
pub fn set_family(s: u64, v6: bool) {
    let bit = 1u64 << (s % 64);
    if v6 {
        V6[s as usize / 64].fetch_or(bit, Ordering::Relaxed);
    } else {
        V6[s as usize / 64].fetch_and(!bit, Ordering::Relaxed);
    }
}

/// The IPv4 address an IPv6 one stands for here (see the module), or `EACCES`.
fn to_v4(addr: [u8; 16]) -> Result<u32, i32> {
    let ip = core::net::Ipv6Addr::from(addr);
    if ip.is_unspecified() {
        Ok(0)
    } else if ip.is_loopback() {
        Ok(0x7f00_0001)
    } else if let Some(v4) = ip.to_ipv4_mapped() {
        Ok(u32::from(v4))
    } else {
        Err(EACCES)
    }
}

/// The IPv6 address shown for IPv4 address `ip` (see the module).
fn from_v4(ip: u32) -> [u8; 16] {
    match ip {
        0 => core::net::Ipv6Addr::UNSPECIFIED.octets(),
        0x7f00_0001 => core::net::Ipv6Addr::LOCALHOST.octets(),
        _ => core::net::Ipv4Addr::from(ip).to_ipv6_mapped().octets(),
    }
}

/// `(ip, port)` of the `sockaddr_in6` at `name` (`len` bytes).
pub fn read(name: *const u8, len: u32) -> Result<(u32, u16), i32> {
    if name.is_null() || (len as usize) < core::mem::size_of::<SockaddrIn6>() {
        return Err(EINVAL);
    }
    // SAFETY: the caller passes `len` readable bytes, at least a sockaddr_in6.
    let sa = unsafe { core::ptr::read_unaligned(name.cast::<SockaddrIn6>()) };
    Ok((to_v4(sa.addr)?, u16::from_be(sa.port_be)))
}

/// Writes `ip:port` as a `sockaddr_in6` at `name` (at most `*namelen` bytes; `*namelen` becomes
/// the full size, as `getsockname` does).
pub fn write(ip: u32, port: u16, name: *mut u8, namelen: *mut u32) {
    if name.is_null() || namelen.is_null() {
        return;
    }
    let sa = SockaddrIn6 {
        len: core::mem::size_of::<SockaddrIn6>() as u8,
        family: AF_INET6 as u8,
        port_be: port.to_be(),
        flowinfo: 0,
        addr: from_v4(ip),
        scope_id: 0,
    };
    // SAFETY: the caller passes `*namelen` writable bytes at `name`.
    unsafe {
        let room = (*namelen as usize).min(core::mem::size_of::<SockaddrIn6>());
        core::ptr::copy_nonoverlapping((&sa as *const SockaddrIn6).cast::<u8>(), name, room);
        *namelen = core::mem::size_of::<SockaddrIn6>() as u32;
    }
}
