//! Name resolution without DNS, by design (a guest reaches nothing but the loopback addresses
//! it was given): `getaddrinfo` answers `localhost` and numeric IPv4 addresses with one IPv4
//! address, anything else with `EAI_NONAME` (std: "failed to lookup address information").

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use core::ffi::CStr;

/// hermit-abi's `addrinfo`.
#[repr(C)]
#[derive(Debug)]
pub struct AddrInfo {
    flags: i32,
    family: i32,
    socktype: i32,
    protocol: i32,
    addrlen: u32,
    canonname: *mut u8,
    addr: *mut u8,
    next: *mut AddrInfo,
}

/// One answer: the `addrinfo` and its `sockaddr_in`, in one allocation.
#[repr(C)]
struct Answer {
    info: AddrInfo,
    addr: [u8; 16],
}

const AF_UNSPEC: i32 = 0;
const AF_INET: i32 = 3;
const SOCK_STREAM: i32 = 1;
const IPPROTO_TCP: i32 = 6;
const EAI_FAMILY: i32 = 5;
const EAI_MEMORY: i32 = 6;
const EAI_NONAME: i32 = 8;
const EAI_SERVICE: i32 = 9;

/// `localhost` or a dotted IPv4 address.
fn lookup(name: &[u8]) -> Option<u32> {
    if name.eq_ignore_ascii_case(b"localhost") {
        return Some(0x7f00_0001);
    }
    let text = core::str::from_utf8(name).ok()?;
    let ip: core::net::Ipv4Addr = text.parse().ok()?;
    Some(u32::from(ip))
}

/// `int sys_getaddrinfo(const char *node, const char *service, const addrinfo *hints,
/// addrinfo **res)`: see the module; `service` null or a port number.
///
/// # Safety
/// `node`/`service` are null or C strings; `hints` null or an `addrinfo`; `res` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_getaddrinfo(
    node: *const u8,
    service: *const u8,
    hints: *const AddrInfo,
    res: *mut *mut AddrInfo,
) -> i32 {
    if res.is_null() {
        return EAI_NONAME;
    }
    // SAFETY: the caller's contract.
    if let Some(h) = unsafe { hints.as_ref() } {
        if h.family != AF_UNSPEC && h.family != AF_INET {
            return EAI_FAMILY;
        }
    }
    let ip = if node.is_null() {
        0x7f00_0001
    } else {
        // SAFETY: a C string (the caller's contract).
        match lookup(unsafe { CStr::from_ptr(node.cast()) }.to_bytes()) {
            Some(ip) => ip,
            None => return EAI_NONAME,
        }
    };
    let port = if service.is_null() {
        0
    } else {
        // SAFETY: as above.
        let s = unsafe { CStr::from_ptr(service.cast()) };
        match s.to_str().ok().and_then(|s| s.parse::<u16>().ok()) {
            Some(p) => p,
            None => return EAI_SERVICE,
        }
    };
    // SAFETY: `Answer` has a non-zero size; all zeroes is a valid start.
    let a = unsafe { alloc_zeroed(Layout::new::<Answer>()) }.cast::<Answer>();
    if a.is_null() {
        return EAI_MEMORY;
    }
    // SAFETY: `a` is a fresh, zeroed `Answer`; `res` is writable (checked non-null).
    unsafe {
        let addr = &mut (*a).addr;
        addr[0] = 16;
        addr[1] = AF_INET as u8;
        addr[2..4].copy_from_slice(&port.to_be_bytes());
        addr[4..8].copy_from_slice(&ip.to_be_bytes());
        (*a).info = AddrInfo {
            flags: 0,
            family: AF_INET,
            socktype: SOCK_STREAM,
            protocol: IPPROTO_TCP,
            addrlen: 16,
            canonname: core::ptr::null_mut(),
            addr: addr.as_mut_ptr(),
            next: core::ptr::null_mut(),
        };
        *res = a.cast();
    }
    0
}

/// `void sys_freeaddrinfo(addrinfo *ai)`: frees what `sys_getaddrinfo` answered.
///
/// # Safety
/// `ai` is null or an answer of `sys_getaddrinfo` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_freeaddrinfo(ai: *mut AddrInfo) {
    if !ai.is_null() {
        // SAFETY: the caller's contract: allocated with this layout.
        unsafe { dealloc(ai.cast(), Layout::new::<Answer>()) }
    }
}
