//! Receiving ahead into a stream's `NetRx` buffer in guest memory (`protocol::net::NetRx`):
//! whenever the host socket has data the VMM (the net thread, or a vCPU thread in an
//! `rx_resume` exit) moves it into the buffer, so the guest's `recv` finds it there without an
//! exit. A guest thread that waits leaves a tag in `waiter`; each fill reports it.

use std::mem::offset_of;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicU32, Ordering};

use protocol::net::*;

use super::byte_ring::{first_span, used, ByteRing};
use super::{epoll_update, errno, neg, Kind, Net, Table};
use crate::memory::GuestRam;

/// The VMM's view of one receive buffer (the guest's copy of `head` is never read back).
#[derive(Debug)]
pub(super) struct RxArea {
    ring: ByteRing,
    head: u32,
    /// Full: the VMM waits for `rx_resume`.
    pub(super) stalled: bool,
    /// End of stream or an error reached: nothing more to receive.
    pub(super) done: bool,
}

/// How a fill ended.
pub(super) struct Filled {
    /// A tag the guest left in `waiter`, to report.
    pub(super) waiter: Option<u32>,
}

impl RxArea {
    /// A receive buffer at `gpa`, checked to lie in guest RAM at or above the image.
    pub(super) fn new(ram: &GuestRam, image_start: u64, gpa: u64) -> Result<RxArea, String> {
        let ring = ByteRing::new(
            ram,
            image_start,
            "receive buffer",
            gpa,
            std::mem::size_of::<NetRx>(),
            offset_of!(NetRx, data),
            NET_RX_BYTES,
        )?;
        let area = RxArea {
            ring,
            head: 0,
            stalled: false,
            done: false,
        };
        for offset in [offset_of!(NetRx, head), offset_of!(NetRx, tail)] {
            area.word(ram, offset).store(0, Ordering::Relaxed);
        }
        area.word(ram, offset_of!(NetRx, state))
            .store(0, Ordering::Relaxed);
        area.word(ram, offset_of!(NetRx, waiter))
            .store(0, Ordering::Release);
        Ok(area)
    }

    /// Whether the VMM should watch the host socket for data.
    pub(super) fn wants_data(&self) -> bool {
        !self.stalled && !self.done
    }

    fn word<'g>(&self, ram: &'g GuestRam, offset: usize) -> &'g AtomicU32 {
        self.ring.word(ram, offset)
    }

    /// `rx_resume`: the guest made room.
    pub(super) fn resume(&mut self, ram: &GuestRam) {
        self.word(ram, offset_of!(NetRx, state))
            .fetch_and(!NET_RX_STALLED, Ordering::SeqCst);
        self.stalled = false;
    }

    /// Receive what the host socket has (until it would block, the buffer is full, or the
    /// stream ends), then take the guest's waiting tag. `Err` is a protocol violation.
    pub(super) fn fill(&mut self, ram: &GuestRam, fd: RawFd) -> Result<Filled, String> {
        let tail_word = self.word(ram, offset_of!(NetRx, tail));
        let head_word = self.word(ram, offset_of!(NetRx, head));
        let state = self.word(ram, offset_of!(NetRx, state));
        while self.wants_data() {
            let tail = tail_word.load(Ordering::SeqCst);
            let Some(used) = used(self.head, tail, NET_RX_BYTES) else {
                return Err(format!(
                    "receive buffer {:#x}: tail {tail} is past head {}",
                    self.ring.gpa(),
                    self.head
                ));
            };
            if used == NET_RX_BYTES {
                // Stalled unless the guest made room meanwhile (it checks `state` after its
                // `tail` store: one of the two sides sees the other).
                state.fetch_or(NET_RX_STALLED, Ordering::SeqCst);
                if tail_word.load(Ordering::SeqCst) == tail {
                    self.stalled = true;
                    break;
                }
                state.fetch_and(!NET_RX_STALLED, Ordering::SeqCst);
                continue;
            }
            let (at, room) = first_span(self.head, NET_RX_BYTES - used, NET_RX_BYTES);
            let data = self.ring.data_at(ram, at) as *mut libc::c_void;
            // SAFETY: `data .. + room` lies inside the area's buffer (`first_span`), free space
            // the guest does not read until `head` passes it.
            let r = unsafe { libc::recv(fd, data, room, 0) };
            if r > 0 {
                self.head = self.head.wrapping_add(r as u32);
                head_word.store(self.head, Ordering::SeqCst);
                if (r as usize) < room {
                    // The socket is drained for now (a short read): the level-triggered
                    // registration reports whatever comes next, without an `EAGAIN` call here.
                    break;
                }
                continue;
            }
            if r == 0 {
                state.fetch_or(NET_RX_EOF, Ordering::SeqCst);
                self.done = true;
                break;
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => break,
                e => {
                    state.fetch_or(NET_RX_ERROR | ((e as u32) << 16), Ordering::SeqCst);
                    self.done = true;
                }
            }
        }
        fence(Ordering::SeqCst);
        Ok(Filled {
            waiter: self.take_waiter(ram)?,
        })
    }

    /// The guest's waiting tag, if any (swapped out: reported once).
    pub(super) fn take_waiter(&self, ram: &GuestRam) -> Result<Option<u32>, String> {
        match self
            .word(ram, offset_of!(NetRx, waiter))
            .swap(0, Ordering::SeqCst)
        {
            0 => Ok(None),
            w if (w as usize) <= NET_RING_CAPACITY => Ok(Some(w - 1)),
            w => Err(format!(
                "receive buffer {:#x}: waiter {w} is not a tag + 1",
                self.ring.gpa()
            )),
        }
    }
}

impl Net {
    /// `rx_setup(s, gpa)`: a connected stream receives ahead into the guest's buffer.
    pub(super) fn rx_setup(
        &self,
        ram: &GuestRam,
        image_start: u64,
        table: &mut Table,
        s: usize,
        gpa: u64,
    ) -> Result<u64, String> {
        let area = RxArea::new(ram, image_start, gpa)?;
        let sock = table.socks[s].as_mut().expect("checked");
        if !matches!((&sock.kind, &sock.fd), (Kind::Stream, Some(_))) {
            return Ok(neg(libc::ENOTCONN));
        }
        if sock.rx.is_some() || sock.read_tag.is_some() {
            return Ok(neg(libc::EBUSY));
        }
        sock.rx = Some(area);
        let data = (u64::from(sock.generation) << 32) | s as u64;
        if let Err(e) = epoll_update(&self.epoll, sock, data) {
            sock.rx = None;
            return Ok(neg(e));
        }
        Ok(0)
    }

    /// `rx_resume(s)`: the guest made room in a stalled buffer; watch the socket again.
    pub(super) fn rx_resume(
        &self,
        ram: &GuestRam,
        table: &mut Table,
        s: usize,
    ) -> Result<u64, String> {
        let sock = table.socks[s].as_mut().expect("checked");
        let Some(rx) = &mut sock.rx else {
            return Ok(neg(libc::EINVAL));
        };
        rx.resume(ram);
        let data = (u64::from(sock.generation) << 32) | s as u64;
        Ok(match epoll_update(&self.epoll, sock, data) {
            Ok(()) => 0,
            Err(e) => neg(e),
        })
    }
}
