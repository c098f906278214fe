//! Receive buffers (`protocol::net::NetRx`): every accepted or connected stream gets one, and
//! the VMM receives ahead into it, so a `recv` that finds bytes there makes no exit. A `recv`
//! that finds it empty parks its thread (`activm_rt::net::wait_for`) until the VMM reports new
//! bytes, the end of the stream or an error; a full buffer the VMM stopped filling is resumed
//! with one `rx_resume` call once this side made room.

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use core::ptr;
use core::sync::atomic::{fence, AtomicBool, AtomicPtr, Ordering};

use activm_stub::protocol::net::*;

use crate::socket_call::net;

const EAGAIN: i64 = 11;

static AREAS: [AtomicPtr<NetRx>; NET_MAX_SOCKETS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; NET_MAX_SOCKETS];
/// One reader at a time per buffer (threads sharing a `&TcpStream`).
static READING: [AtomicBool; NET_MAX_SOCKETS] = [const { AtomicBool::new(false) }; NET_MAX_SOCKETS];

/// A new, zeroed buffer (null if the heap is exhausted: the socket then receives by exits).
pub fn new_area() -> *mut NetRx {
    // SAFETY: `NetRx` has a non-zero size; all zeroes is its initial value (atomics and bytes).
    unsafe { alloc_zeroed(Layout::new::<NetRx>()).cast() }
}

/// Frees a buffer that no socket uses (or whose socket the VMM closed).
///
/// # Safety
/// `area` came from [`new_area`] and the VMM no longer writes it.
pub unsafe fn free_area(area: *mut NetRx) {
    if !area.is_null() {
        // SAFETY: the caller's contract; same layout as allocated.
        unsafe { dealloc(area.cast(), Layout::new::<NetRx>()) }
    }
}

/// Gives connected socket `s` a buffer if the VMM takes one: it receives ahead from now on
/// (else, without memory, by one exit per `recv`).
pub fn set_up(s: u64) {
    let area = new_area();
    if area.is_null() {
        return;
    }
    if net(NET_OP_RX_SETUP, s, area as u64, 0, 0) == 0 {
        attach(s, area);
    } else {
        // SAFETY: the VMM refused the buffer.
        unsafe { free_area(area) };
    }
}

/// Socket `s` now receives into `area` (the VMM accepted it).
pub fn attach(s: u64, area: *mut NetRx) {
    AREAS[s as usize].store(area, Ordering::Release);
}

/// Detaches `s`'s buffer (before the VMM closes the socket, whose number another `accept`
/// may take right after): the caller frees it once the VMM closed the socket.
pub fn detach(s: u64) -> *mut NetRx {
    AREAS[s as usize].swap(ptr::null_mut(), Ordering::AcqRel)
}

struct Reading(usize);

impl Reading {
    fn lock(s: usize) -> Reading {
        while READING[s]
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            activm_rt::thread::yield_now();
        }
        Reading(s)
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING[self.0].store(false, Ordering::Release);
    }
}

/// `recv` on `s` through its buffer: `None` if it has none (the caller makes the `recv` call),
/// else the byte count, 0 at the end of the stream, or `-errno` (`-EAGAIN` once `deadline`,
/// the receive timeout's, passed).
///
/// # Safety
/// `buf` points to `len` writable bytes.
pub unsafe fn recv(
    s: u64,
    buf: *mut u8,
    len: usize,
    peek: bool,
    nonblocking: bool,
    deadline: Option<u64>,
) -> Option<i64> {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return None;
    }
    // SAFETY: attached buffers live until the socket is closed, which std never does while a
    // call on it runs (the stream is borrowed); only atomics are accessed through `rx`.
    let rx = unsafe { &*area };
    loop {
        let reading = Reading::lock(s as usize);
        let tail = rx.tail.load(Ordering::Relaxed);
        let head = rx.head.load(Ordering::SeqCst);
        let have = head.wrapping_sub(tail) as usize;
        if have > 0 {
            let n = have.min(len);
            let at = tail as usize % NET_RX_BYTES;
            let first = n.min(NET_RX_BYTES - at);
            // SAFETY: `data[tail..tail + n]` (wrapping) was written by the VMM before its
            // `head` store, which the load above saw; `buf` has `len >= n` bytes.
            unsafe {
                let data = ptr::addr_of!((*area).data).cast::<u8>();
                ptr::copy_nonoverlapping(data.add(at), buf, first);
                ptr::copy_nonoverlapping(data, buf.add(first), n - first);
            }
            if !peek && n > 0 {
                rx.tail.store(tail.wrapping_add(n as u32), Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if rx.state.load(Ordering::SeqCst) & NET_RX_STALLED != 0 {
                    // The buffer has room again.
                    net(NET_OP_RX_RESUME, s, 0, 0, 0);
                }
            }
            return Some(n as i64);
        }
        drop(reading);
        let state = rx.state.load(Ordering::SeqCst);
        if state & (NET_RX_EOF | NET_RX_ERROR) != 0 {
            if rx.head.load(Ordering::SeqCst) != tail {
                continue; // bytes came before the end
            }
            if state & NET_RX_ERROR != 0 {
                return Some(-i64::from(state >> 16));
            }
            return Some(0);
        }
        if len == 0 {
            return Some(0);
        }
        if nonblocking {
            return Some(-EAGAIN);
        }
        let ready = || {
            rx.head.load(Ordering::SeqCst) != tail
                || rx.state.load(Ordering::SeqCst) & (NET_RX_EOF | NET_RX_ERROR) != 0
        };
        if crate::socket_timeout::wait_for(&rx.waiter, ready, deadline) && !ready() {
            return Some(-EAGAIN);
        }
    }
}

/// Whether `s` receives through a buffer (`poll` then looks there).
pub fn readable(s: u64) -> Option<()> {
    (!AREAS[s as usize].load(Ordering::Acquire).is_null()).then_some(())
}

/// The `waiter` word of `s`'s buffer, if it has one (`poll` of several descriptors leaves its
/// tag there).
pub fn waiter_word(s: u64) -> Option<&'static core::sync::atomic::AtomicU32> {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    // SAFETY: as in `recv`: the buffer lives while the socket is open, and `poll`'s caller
    // keeps it open for the call (std and mio close a descriptor no `poll` watches).
    (!area.is_null()).then(|| unsafe { &(*area).waiter })
}

/// `poll(POLLIN)` on `s`'s buffer: `POLLIN` (with `POLLERR` after an error) once bytes, the
/// end of the stream or an error are there; 0 if not (`wait`: not before `deadline`).
pub fn wait_readable(s: u64, deadline: Option<u64>, wait: bool) -> i16 {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return 0;
    }
    // SAFETY: as in `recv`: the buffer lives while the socket is open.
    let rx = unsafe { &*area };
    loop {
        let tail = rx.tail.load(Ordering::SeqCst);
        let ready = || {
            rx.head.load(Ordering::SeqCst) != tail
                || rx.state.load(Ordering::SeqCst) & (NET_RX_EOF | NET_RX_ERROR) != 0
        };
        if ready() {
            let error = rx.state.load(Ordering::SeqCst) & NET_RX_ERROR != 0;
            return 0x1 | if error { 0x8 } else { 0 };
        }
        if !wait || crate::socket_timeout::wait_for(&rx.waiter, ready, deadline) && !ready() {
            return 0;
        }
    }
}
