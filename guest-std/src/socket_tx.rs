//! Transmit rings (`protocol::net::NetTx`): every accepted or connected stream gets one, and
//! `send` queues its bytes there. While the VMM's sender is awake (`NetRing::sender`) it finds
//! them by itself and the `send` makes no exit; else one `tx_flush` call (the doorbell) sends
//! them. A `send` that finds the ring full parks its thread (`activm_rt::net::wait_for`) until
//! the VMM made room; `close` waits until the ring is empty.

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use activm_stub::protocol::net::*;

use crate::socket_call::{net, waiting};

const EAGAIN: i64 = 11;

static AREAS: [AtomicPtr<NetTx>; NET_MAX_SOCKETS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; NET_MAX_SOCKETS];
/// One writer at a time per ring (threads sharing a `&TcpStream`).
static WRITING: [AtomicBool; NET_MAX_SOCKETS] = [const { AtomicBool::new(false) }; NET_MAX_SOCKETS];

/// A new, zeroed ring (null if the heap is exhausted: the socket then sends by exits).
pub fn new_area() -> *mut NetTx {
    // SAFETY: `NetTx` has a non-zero size; all zeroes is its initial value (atomics and bytes).
    unsafe { alloc_zeroed(Layout::new::<NetTx>()).cast() }
}

/// Frees a ring that no socket uses (or whose socket the VMM closed).
///
/// # Safety
/// `area` came from [`new_area`] and the VMM no longer reads it.
pub unsafe fn free_area(area: *mut NetTx) {
    if !area.is_null() {
        // SAFETY: the caller's contract; same layout as allocated.
        unsafe { dealloc(area.cast(), Layout::new::<NetTx>()) }
    }
}

/// Gives `s` a transmit ring if the VMM takes one (a connected stream).
pub fn set_up(s: u64) {
    let area = new_area();
    if area.is_null() {
        return;
    }
    if net(NET_OP_TX_SETUP, s, area as u64, 0, 0) == 0 {
        AREAS[s as usize].store(area, Ordering::Release);
    } else {
        // SAFETY: the VMM refused the ring.
        unsafe { free_area(area) };
    }
}

/// Socket `s` sends from `area` again (a close that failed).
pub fn attach(s: u64, area: *mut NetTx) {
    AREAS[s as usize].store(area, Ordering::Release);
}

/// Detaches `s`'s ring (before the VMM closes the socket): the caller frees it once the VMM
/// closed the socket.
pub fn detach(s: u64) -> *mut NetTx {
    AREAS[s as usize].swap(ptr::null_mut(), Ordering::AcqRel)
}

struct Writing(usize);

impl Writing {
    fn lock(s: usize) -> Writing {
        while WRITING[s]
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            activm_rt::thread::yield_now();
        }
        Writing(s)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        WRITING[self.0].store(false, Ordering::Release);
    }
}

fn failed(tx: &NetTx) -> Option<i64> {
    let state = tx.state.load(Ordering::SeqCst);
    (state & NET_TX_ERROR != 0).then(|| -i64::from(state >> 16))
}

/// The doorbell of `s`'s ring: the VMM sends what is queued.
fn flush(s: u64, tag: u64) -> i64 {
    net(NET_OP_TX_FLUSH, s, tag, 0, 0)
}

/// The doorbell, unless the VMM's sender is awake (it looks at the ring by itself). The
/// caller stored `head` first (sequentially consistent): one of the two sides sees the other.
fn ring_doorbell(s: u64) {
    if !activm_rt::net::sender_polling() {
        flush(s, NET_NO_WAIT);
    }
}

/// `send` on `s` through its ring: `None` if it has none (the caller makes the `send` call),
/// else the bytes queued or `-errno` (`-EAGAIN` once `deadline`, the send timeout's, passed).
///
/// # Safety
/// `buf` points to `len` readable bytes.
pub unsafe fn send(
    s: u64,
    buf: *const u8,
    len: usize,
    nonblocking: bool,
    deadline: Option<u64>,
) -> Option<i64> {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return None;
    }
    // SAFETY: attached rings live until the socket is closed, which std never does while a
    // call on it runs (the stream is borrowed); only atomics are accessed through `tx`.
    let tx = unsafe { &*area };
    let _writing = Writing::lock(s as usize);
    loop {
        if let Some(e) = failed(tx) {
            return Some(e);
        }
        let head = tx.head.load(Ordering::Relaxed);
        let tail = tx.tail.load(Ordering::SeqCst);
        let queued = (head.wrapping_sub(tail) as usize).min(NET_TX_BYTES);
        let room = NET_TX_BYTES - queued;
        if len == 0 {
            return Some(0);
        }
        if room > 0 {
            let n = room.min(len);
            let at = head as usize % NET_TX_BYTES;
            let first = n.min(NET_TX_BYTES - at);
            // SAFETY: `data[head..head + n]` (wrapping) is free: the VMM sent it (its `tail`
            // passed it) and reads it only after the `head` store below; `buf` has `len >= n`.
            unsafe {
                let data = ptr::addr_of_mut!((*area).data).cast::<u8>();
                ptr::copy_nonoverlapping(buf, data.add(at), first);
                ptr::copy_nonoverlapping(buf.add(first), data, n - first);
            }
            tx.head.store(head.wrapping_add(n as u32), Ordering::SeqCst);
            // Rung when this vCPU has served its other ready threads (one exit for all).
            activm_rt::net::defer_doorbell();
            return Some(n as i64);
        }
        ring_doorbell(s);
        if nonblocking {
            return Some(-EAGAIN);
        }
        let ready = || tx.tail.load(Ordering::SeqCst) != tail || failed(tx).is_some();
        if crate::socket_timeout::wait_for(&tx.waiter, ready, deadline) && !ready() {
            return Some(-EAGAIN);
        }
    }
}

/// Waits until everything queued on `area` was sent or the stream failed (before `close` or
/// `shutdown`).
pub fn drain(s: u64) {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return;
    }
    // SAFETY: as in `send`: the ring lives until the socket is closed, after this.
    let tx = unsafe { &*area };
    let _writing = Writing::lock(s as usize);
    while failed(tx).is_none() && tx.tail.load(Ordering::SeqCst) != tx.head.load(Ordering::Relaxed)
    {
        // The doorbell, parked while the host socket is full: 0 once the ring is empty.
        match waiting(s, |tag| flush(s, tag)) {
            r if r == -EAGAIN => activm_rt::thread::yield_now(),
            r if r < 0 => return,
            _ => {}
        }
    }
}

/// Whether `s` sends from a ring (`poll` then looks there).
pub fn room(s: u64) -> Option<()> {
    (!AREAS[s as usize].load(Ordering::Acquire).is_null()).then_some(())
}

/// The `waiter` word of `s`'s ring, if it has one (`poll` of several descriptors leaves its
/// tag there), after the doorbell (a full ring is sent as the host socket drains).
pub fn waiter_word(s: u64) -> Option<&'static core::sync::atomic::AtomicU32> {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return None;
    }
    ring_doorbell(s);
    // SAFETY: as in `send`: the ring lives while the socket is open, and `poll`'s caller keeps
    // it open for the call.
    Some(unsafe { &(*area).waiter })
}

/// `poll(POLLOUT)` on `s`'s ring: `POLLOUT` (with `POLLERR` after an error) once it has room;
/// 0 if not (`wait`: not before `deadline`).
pub fn wait_room(s: u64, deadline: Option<u64>, wait: bool) -> i16 {
    let area = AREAS[s as usize].load(Ordering::Acquire);
    if area.is_null() {
        return 0;
    }
    // SAFETY: as in `send`: the ring lives while the socket is open.
    let tx = unsafe { &*area };
    loop {
        if failed(tx).is_some() {
            return 0x4 | 0x8;
        }
        let tail = tx.tail.load(Ordering::SeqCst);
        if (tx.head.load(Ordering::SeqCst).wrapping_sub(tail) as usize) < NET_TX_BYTES {
            return 0x4;
        }
        if !wait {
            return 0;
        }
        ring_doorbell(s);
        let ready = || tx.tail.load(Ordering::SeqCst) != tail || failed(tx).is_some();
        if crate::socket_timeout::wait_for(&tx.waiter, ready, deadline) && !ready() {
            return 0;
        }
    }
}
