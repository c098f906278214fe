//! The readiness side of guest sockets: epoll registrations, handling the events, and
//! publishing `(tag, events)` into the guest's `NetRing` (the block ring's protocol). The
//! guest's net thread (`thread.rs`) drives it.

use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use protocol::net::*;

use super::linger::LINGER_EVENT;
use super::{errno, Net, Sock, Table};
use crate::memory::GuestRam;

/// The events `sock` should be registered for. A stream with a receive buffer stays
/// registered, edge-triggered: every arrival of data (or room, or the peer's close) queues one
/// event, and the net thread reads until a short read, so nothing needs re-arming per event.
/// Other sockets (listeners, connects in progress) are one-shot.
fn wanted_events(sock: &Sock) -> u32 {
    let mut events = libc::EPOLLRDHUP as u32;
    events |= if sock.rx.is_some() {
        libc::EPOLLET as u32
    } else {
        libc::EPOLLONESHOT as u32
    };
    if sock.read_tag.is_some() || sock.rx.as_ref().is_some_and(|rx| rx.wants_data()) {
        events |= libc::EPOLLIN as u32;
    }
    if sock.write_tag.is_some() || sock.tx.as_ref().is_some_and(|tx| tx.wants_room()) {
        events |= libc::EPOLLOUT as u32;
    }
    events
}

/// (Re-)register `sock` for what its tags and buffers wait for. A modification makes the
/// kernel look at the socket's readiness again, so a condition already true is reported.
pub(super) fn epoll_update(epoll: &OwnedFd, sock: &mut Sock, data: u64) -> Result<(), i32> {
    let Some(fd) = &sock.fd else {
        return Err(libc::ENOTCONN);
    };
    let events = wanted_events(sock);
    let mut ev = libc::epoll_event { events, u64: data };
    let op = if sock.in_epoll {
        libc::EPOLL_CTL_MOD
    } else {
        libc::EPOLL_CTL_ADD
    };
    // SAFETY: both descriptors are live; `ev` is a valid event.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) } < 0 {
        return Err(errno());
    }
    sock.in_epoll = true;
    sock.registered = events;
    Ok(())
}

/// After an event: one-shot registrations are re-armed; an edge-triggered one only when what
/// the socket waits for changed (a buffer filled up, the ring waits for room or stopped).
fn rearm_after_event(epoll: &OwnedFd, sock: &mut Sock, data: u64) {
    let events = wanted_events(sock);
    let waits = events & (libc::EPOLLIN | libc::EPOLLOUT) as u32 != 0;
    if events & libc::EPOLLET as u32 != 0 {
        if events != sock.registered {
            let _ = epoll_update(epoll, sock, data);
        }
    } else if waits {
        let _ = epoll_update(epoll, sock, data);
    }
}

/// Queue `(tag, events)` for the ring (the caller publishes with [`publish`]).
pub(super) fn post(table: &mut Table, tag: u32, events: u64) {
    table.waiting[tag as usize / 64] &= !(1u64 << (tag % 64));
    PENDING.with(|p| p.borrow_mut().push((tag, events)));
}

thread_local! {
    /// Completions taken under the table's lock, published before it is released.
    static PENDING: std::cell::RefCell<Vec<(u32, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether completions wait to be published.
pub(super) fn pending() -> bool {
    PENDING.with(|p| !p.borrow().is_empty())
}

/// Write the queued completions into the guest's ring (under the table's lock); how many.
/// `Err`: the guest corrupted its ring (what was queued is dropped).
pub(super) fn publish(table: &mut Table, ram: &GuestRam) -> Result<usize, String> {
    let pending: Vec<(u32, u64)> = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let Some(ring) = table.ring else {
        return Ok(0);
    };
    for &(tag, events) in &pending {
        let head = table.head;
        let tail = ram
            .read_bytes(ring + offset_of!(NetRing, tail) as u64, 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let written = tail.map_err(|e| e.to_string()).and_then(|tail| {
            if head.wrapping_sub(tail) as usize >= NET_RING_CAPACITY {
                return Err(format!(
                    "the guest corrupted its net ring: no room (head {head}, tail {tail})"
                ));
            }
            let slot = head as usize % NET_RING_CAPACITY;
            let entry = ring
                + offset_of!(NetRing, entries) as u64
                + (slot * std::mem::size_of::<NetCompletion>()) as u64;
            ram.write_struct(
                entry,
                &NetCompletion {
                    tag: u64::from(tag),
                    events,
                },
            )
            .map_err(|e| e.to_string())?;
            fence(Ordering::Release);
            ram.write_u32(
                ring + offset_of!(NetRing, head) as u64,
                head.wrapping_add(1),
            )
            .map_err(|e| e.to_string())
        });
        written?;
        table.head = head.wrapping_add(1);
    }
    Ok(pending.len())
}

/// The epoll data of the transmit doorbell's eventfd (`thread.rs`; no socket index is
/// `u32::MAX`, and a lingering socket's key has bits 32-62 clear).
pub(super) const DOORBELL_EVENT: u64 = u64::MAX;

/// Handles readiness events: fills receive buffers, sends what waited for room, posts the tags
/// that waited. Whether there were any; `Err` is a protocol violation.
pub(super) fn handle_events(
    net: &Net,
    ram: &GuestRam,
    table: &mut Table,
    events: &[libc::epoll_event],
) -> Result<bool, String> {
    for ev in events {
        let (data, bits) = (ev.u64, u64::from(ev.events));
        if data == DOORBELL_EVENT {
            // The caller sends what every ring holds after the events.
            continue;
        }
        if data & LINGER_EVENT != 0 {
            net.linger_event(table, data);
            continue;
        }
        let s = (data & 0xffff_ffff) as usize;
        let Some(Some(sock)) = table.socks.get_mut(s) else {
            continue;
        };
        if sock.generation != (data >> 32) as u32 {
            continue;
        }
        let bad = NET_ERROR | NET_HANGUP;
        let mut ready = Vec::new();
        if let (Some(rx), Some(fd)) = (&mut sock.rx, &sock.fd) {
            if bits & (NET_READABLE | bad | libc::EPOLLRDHUP as u64) != 0 {
                let filled = rx.fill(ram, fd.as_raw_fd())?;
                ready.extend(filled.waiter.map(|t| (t, NET_READABLE)));
            }
        }
        if bits & (NET_READABLE | bad | libc::EPOLLRDHUP as u64) != 0 {
            ready.extend(sock.read_tag.take().map(|t| (t, bits & 0x1f)));
        }
        let room = bits & (NET_WRITABLE | bad) != 0;
        let resend = room && sock.tx.as_ref().is_some_and(|tx| tx.wants_room());
        if room {
            ready.extend(sock.write_tag.take().map(|t| (t, bits & 0x1f)));
        }
        rearm_after_event(&net.epoll, sock, data);
        for (tag, events) in ready {
            post(table, tag, events);
        }
        if resend {
            net.send_queued(ram, table, s)?;
        }
    }
    Ok(!events.is_empty())
}
