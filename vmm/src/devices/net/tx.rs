//! Transmit rings (`protocol::net::NetTx`): a stream's `send` queues bytes in guest memory and
//! the VMM sends them. The net thread looks at every ring by itself while it is awake
//! (`NetRing::sender`); a guest that queued bytes while it sleeps rings the doorbell, a
//! `tx_flush` exit, and the vCPU thread sends them in that exit. When the host socket is full,
//! the net thread watches it for `EPOLLOUT` and sends the rest as it drains. A guest thread that
//! waits for room leaves a tag in `waiter`; a send that made room reports it.

use std::mem::offset_of;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};

use protocol::net::*;

use super::byte_ring::{first_span, used, ByteRing};
use super::{epoll_update, errno, neg, poll::post, Kind, Net, Table};
use crate::guest::Guest;

/// The VMM's view of one transmit ring (its own copy of `tail`; `head` is the guest's).
#[derive(Debug)]
pub(super) struct TxArea {
    ring: ByteRing,
    tail: u32,
    /// The host socket was full: the VMM watches it for `EPOLLOUT`.
    pub(super) blocked: bool,
    /// Sending failed: queued bytes are dropped.
    failed: bool,
}

impl TxArea {
    fn new(guest: &Guest, gpa: u64) -> Result<TxArea, String> {
        let ring = ByteRing::new(
            guest,
            "transmit ring",
            gpa,
            std::mem::size_of::<NetTx>(),
            offset_of!(NetTx, data),
            NET_TX_BYTES,
        )?;
        let area = TxArea {
            ring,
            tail: 0,
            blocked: false,
            failed: false,
        };
        for offset in [
            offset_of!(NetTx, head),
            offset_of!(NetTx, tail),
            offset_of!(NetTx, state),
        ] {
            area.word(guest, offset).store(0, Ordering::Relaxed);
        }
        area.word(guest, offset_of!(NetTx, waiter))
            .store(0, Ordering::Release);
        Ok(area)
    }

    fn word<'g>(&self, guest: &'g Guest, offset: usize) -> &'g AtomicU32 {
        self.ring.word(guest, offset)
    }

    /// Whether the VMM should watch the host socket for room.
    pub(super) fn wants_room(&self) -> bool {
        self.blocked && !self.failed
    }

    /// Whether the guest queued bytes the VMM has not sent (a look, no checks).
    pub(super) fn queued(&self, guest: &Guest) -> bool {
        !self.failed
            && !self.blocked
            && self
                .word(guest, offset_of!(NetTx, head))
                .load(Ordering::SeqCst)
                != self.tail
    }

    /// Send what is queued until the ring is empty or the host socket full (`blocked`). Returns
    /// whether the ring is empty now and a waiting tag to report if room was made. `Err` is a
    /// protocol violation (a `head` more than the ring ahead of `tail`).
    pub(super) fn send(&mut self, guest: &Guest, fd: RawFd) -> Result<(bool, Option<u32>), String> {
        let head_word = self.word(guest, offset_of!(NetTx, head));
        let tail_word = self.word(guest, offset_of!(NetTx, tail));
        let start = self.tail;
        let mut empty = true;
        self.blocked = false;
        while !self.failed {
            let head = head_word.load(Ordering::SeqCst);
            let Some(queued) = used(head, self.tail, NET_TX_BYTES) else {
                return Err(format!(
                    "transmit ring {:#x}: head {head} is more than {NET_TX_BYTES} past tail {}",
                    self.ring.gpa(),
                    self.tail
                ));
            };
            if queued == 0 {
                break;
            }
            let (at, len) = first_span(self.tail, queued, self.ring.cap());
            let data = self.ring.data_at(guest, at) as *const libc::c_void;
            // SAFETY: `data .. + len` lies inside the ring's data area (`first_span`); the guest
            // does not write it before `tail` passes it.
            let r = unsafe { libc::send(fd, data, len, libc::MSG_NOSIGNAL) };
            if r > 0 {
                self.tail = self.tail.wrapping_add(r as u32);
                tail_word.store(self.tail, Ordering::SeqCst);
                continue;
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    self.blocked = true;
                    empty = false;
                    break;
                }
                e => {
                    // Dropped: nothing queued can reach the peer now.
                    self.word(guest, offset_of!(NetTx, state))
                        .fetch_or(NET_TX_ERROR | ((e as u32) << 16), Ordering::SeqCst);
                    self.failed = true;
                    self.tail = head;
                    tail_word.store(head, Ordering::SeqCst);
                }
            }
        }
        fence(Ordering::SeqCst);
        let waiter = if self.tail != start || self.failed {
            self.take_waiter(guest)?
        } else {
            None
        };
        Ok((empty, waiter))
    }

    /// The guest's waiting tag, if any (swapped out: reported once).
    pub(super) fn take_waiter(&self, guest: &Guest) -> Result<Option<u32>, String> {
        match self
            .word(guest, offset_of!(NetTx, waiter))
            .swap(0, Ordering::SeqCst)
        {
            0 => Ok(None),
            w if (w as usize) <= NET_RING_CAPACITY => Ok(Some(w - 1)),
            w => Err(format!(
                "transmit ring {:#x}: waiter {w} is not a tag + 1",
                self.ring.gpa()
            )),
        }
    }

    /// The error that failed the ring, as `-errno`.
    fn error(&self, guest: &Guest) -> Option<u64> {
        let state = self
            .word(guest, offset_of!(NetTx, state))
            .load(Ordering::SeqCst);
        (state & NET_TX_ERROR != 0).then(|| neg((state >> 16) as i32))
    }
}

impl Net {
    /// `tx_setup(s, gpa)`: a connected stream sends from the guest's transmit ring.
    pub(super) fn tx_setup(
        &self,
        guest: &Guest,
        table: &mut Table,
        s: usize,
        gpa: u64,
    ) -> Result<u64, String> {
        let area = TxArea::new(guest, gpa)?;
        let sock = table.socks[s].as_mut().expect("checked");
        if !matches!((&sock.kind, &sock.fd), (Kind::Stream, Some(_))) {
            return Ok(neg(libc::ENOTCONN));
        }
        if sock.tx.is_some() || sock.write_tag.is_some() {
            return Ok(neg(libc::EBUSY));
        }
        sock.tx = Some(area);
        table.tx_socks.push(s);
        Ok(0)
    }

    /// `tx_flush(s, tag)`: the doorbell.
    pub(super) fn tx_flush(
        &self,
        guest: &Guest,
        table: &mut Table,
        s: usize,
        tag: u64,
    ) -> Result<u64, String> {
        let Some(empty) = self.send_queued(guest, table, s)? else {
            return Ok(neg(libc::EINVAL));
        };
        let sock = table.socks[s].as_ref().expect("checked");
        if let Some(e) = sock.tx.as_ref().and_then(|tx| tx.error(guest)) {
            return Ok(e);
        }
        if empty {
            return Ok(0);
        }
        if sock.write_tag.is_some() && tag != NET_NO_WAIT {
            // Another thread waits for this socket's room already.
            return Ok(neg(libc::EAGAIN));
        }
        self.arm(table, s, tag, false)
    }

    /// Send what socket `s` queued (under the table's lock) and post a tag that waited for
    /// room; whether its ring is empty now (`None`: `s` has no ring). `Err` is a protocol
    /// violation.
    pub(super) fn send_queued(
        &self,
        guest: &Guest,
        table: &mut Table,
        s: usize,
    ) -> Result<Option<bool>, String> {
        let Some(Some(sock)) = table.socks.get_mut(s) else {
            return Ok(None);
        };
        let (Some(tx), Some(fd)) = (&mut sock.tx, &sock.fd) else {
            return Ok(None);
        };
        let was_blocked = tx.blocked;
        let (empty, waiter) = tx.send(guest, fd.as_raw_fd())?;
        if tx.blocked || was_blocked {
            // Watch for room (again: the registration is one-shot), or stop.
            let data = (u64::from(sock.generation) << 32) | s as u64;
            let _ = epoll_update(&self.epoll, sock, data);
        }
        if let Some(tag) = waiter {
            post(table, tag, NET_WRITABLE);
        }
        Ok(Some(empty))
    }

    /// The net thread's look at every transmit ring: sends what is queued; whether any was.
    pub(super) fn send_all_queued(&self, guest: &Guest, table: &mut Table) -> Result<bool, String> {
        let mut sent = false;
        let mut i = 0;
        while i < table.tx_socks.len() {
            let s = table.tx_socks[i];
            i += 1;
            let queued = match table.socks.get(s) {
                Some(Some(sock)) => sock.tx.as_ref().is_some_and(|tx| tx.queued(guest)),
                _ => false,
            };
            if queued {
                self.send_queued(guest, table, s)?;
                sent = true;
            }
        }
        Ok(sent)
    }
}
