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
use crate::memory::GuestRam;

/// The VMM's view of one transmit ring (its own copy of `tail`; `head` is the guest's).
#[derive(Debug)]
pub struct TxArea {
    ring: ByteRing,
    tail: u32,
    /// The host socket was full: the VMM watches it for `EPOLLOUT`.
    pub(super) blocked: bool,
    /// Sending failed: queued bytes are dropped.
    failed: bool,
}

impl TxArea {
    /// The ring at `gpa`, checked to lie in `ram` at or above `image_start`, its indices
    /// zeroed. `Err` is a protocol violation.
    pub fn new(ram: &GuestRam, image_start: u64, gpa: u64) -> Result<TxArea, String> {
        let ring = ByteRing::new(
            ram,
            image_start,
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
            area.word(ram, offset).store(0, Ordering::Relaxed);
        }
        area.word(ram, offset_of!(NetTx, waiter))
            .store(0, Ordering::Release);
        Ok(area)
    }

    /// Fuzzing: both indices start at `index`, so the free-running `u32` indices wrap without
    /// 4 GiB of traffic.
    #[cfg(feature = "fuzzing")]
    pub fn start_at(&mut self, ram: &GuestRam, index: u32) {
        self.tail = index;
        for offset in [offset_of!(NetTx, head), offset_of!(NetTx, tail)] {
            self.word(ram, offset).store(index, Ordering::SeqCst);
        }
    }

    fn word<'g>(&self, ram: &'g GuestRam, offset: usize) -> &'g AtomicU32 {
        self.ring.word(ram, offset)
    }

    /// Whether the VMM should watch the host socket for room.
    pub(super) fn wants_room(&self) -> bool {
        self.blocked && !self.failed
    }

    /// Whether the guest queued bytes the VMM has not sent (a look, no checks).
    pub(super) fn queued(&self, ram: &GuestRam) -> bool {
        !self.failed
            && !self.blocked
            && self
                .word(ram, offset_of!(NetTx, head))
                .load(Ordering::SeqCst)
                != self.tail
    }

    /// Send what is queued until the ring is empty or the host socket full (`blocked`). Returns
    /// whether the ring is empty now and a waiting tag to report if room was made. `Err` is a
    /// protocol violation (a `head` more than the ring ahead of `tail`).
    pub fn send(&mut self, ram: &GuestRam, fd: RawFd) -> Result<(bool, Option<u32>), String> {
        let head_word = self.word(ram, offset_of!(NetTx, head));
        let tail_word = self.word(ram, offset_of!(NetTx, tail));
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
            let data = self.ring.data_at(ram, at) as *const libc::c_void;
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
                    self.word(ram, offset_of!(NetTx, state))
                        .fetch_or(NET_TX_ERROR | ((e as u32) << 16), Ordering::SeqCst);
                    self.failed = true;
                    self.tail = head;
                    tail_word.store(head, Ordering::SeqCst);
                }
            }
        }
        fence(Ordering::SeqCst);
        let waiter = if self.tail != start || self.failed {
            self.take_waiter(ram)?
        } else {
            None
        };
        Ok((empty, waiter))
    }

    /// Copies out what is still queued (the socket closes; the VMM sends it later) and empties
    /// the ring. `Err` is a protocol violation.
    pub(super) fn take_queued(&mut self, ram: &GuestRam) -> Result<Vec<u8>, String> {
        if self.failed {
            return Ok(Vec::new());
        }
        let head = self
            .word(ram, offset_of!(NetTx, head))
            .load(Ordering::SeqCst);
        let Some(mut left) = used(head, self.tail, NET_TX_BYTES) else {
            return Err(format!(
                "transmit ring {:#x}: head {head} is more than {NET_TX_BYTES} past tail {}",
                self.ring.gpa(),
                self.tail
            ));
        };
        let mut bytes = Vec::with_capacity(left);
        while left > 0 {
            let (at, len) = first_span(self.tail, left, self.ring.cap());
            let data = self.ring.data_at(ram, at) as *const u8;
            // SAFETY: `data .. + len` lies inside the ring's data area (`first_span`); the
            // guest does not write it before `tail` passes it.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
            self.tail = self.tail.wrapping_add(len as u32);
            left -= len;
        }
        self.word(ram, offset_of!(NetTx, tail))
            .store(self.tail, Ordering::SeqCst);
        Ok(bytes)
    }

    /// The guest's waiting tag, if any (swapped out: reported once).
    pub fn take_waiter(&self, ram: &GuestRam) -> Result<Option<u32>, String> {
        match self
            .word(ram, offset_of!(NetTx, waiter))
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
    fn error(&self, ram: &GuestRam) -> Option<u64> {
        let state = self
            .word(ram, offset_of!(NetTx, state))
            .load(Ordering::SeqCst);
        (state & NET_TX_ERROR != 0).then(|| neg((state >> 16) as i32))
    }
}

impl Net {
    /// `tx_setup(s, gpa)`: a connected stream sends from the guest's transmit ring.
    pub(super) fn tx_setup(
        &self,
        ram: &GuestRam,
        image_start: u64,
        table: &mut Table,
        s: usize,
        gpa: u64,
    ) -> Result<u64, String> {
        let area = TxArea::new(ram, image_start, gpa)?;
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
        ram: &GuestRam,
        table: &mut Table,
        s: usize,
        tag: u64,
    ) -> Result<u64, String> {
        let Some(empty) = self.send_queued(ram, table, s)? else {
            return Ok(neg(libc::EINVAL));
        };
        let sock = table.socks[s].as_ref().expect("checked");
        if let Some(e) = sock.tx.as_ref().and_then(|tx| tx.error(ram)) {
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
        ram: &GuestRam,
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
        let (empty, waiter) = tx.send(ram, fd.as_raw_fd())?;
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
    pub(super) fn send_all_queued(
        &self,
        ram: &GuestRam,
        table: &mut Table,
    ) -> Result<bool, String> {
        let mut sent = false;
        let mut i = 0;
        while i < table.tx_socks.len() {
            let s = table.tx_socks[i];
            i += 1;
            let queued = match table.socks.get(s) {
                Some(Some(sock)) => sock.tx.as_ref().is_some_and(|tx| tx.queued(ram)),
                _ => false,
            };
            if queued {
                self.send_queued(ram, table, s)?;
                sent = true;
            }
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors; the result is checked.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: fresh descriptors owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn sends_in_order_and_refuses_hostile_indices() {
        let ram = GuestRam::new(1 << 20).expect("guest RAM");
        let gpa = 0x1_0000;
        assert!(TxArea::new(&ram, 0x1000, gpa + 8).is_err());
        assert!(TxArea::new(&ram, 0x1000, (1 << 20) - 64).is_err());
        assert!(TxArea::new(&ram, gpa + 64, gpa).is_err());
        let mut tx = TxArea::new(&ram, 0x1000, gpa).expect("ring");
        let (ours, peer) = pair();
        let data = gpa + offset_of!(NetTx, data) as u64;
        let head = gpa + offset_of!(NetTx, head) as u64;
        let waiter = gpa + offset_of!(NetTx, waiter) as u64;
        // 10 bytes across the wrap: tail and head start near the end of the ring.
        tx.tail = (NET_TX_BYTES - 4) as u32;
        ram.write_bytes(data + NET_TX_BYTES as u64 - 4, b"0123")
            .unwrap();
        ram.write_bytes(data, b"456789").unwrap();
        ram.write_u32(head, NET_TX_BYTES as u32 + 6).unwrap();
        ram.write_u32(waiter, 5).unwrap();
        assert_eq!(tx.send(&ram, ours.as_raw_fd()), Ok((true, Some(4))));
        let mut got = [0u8; 16];
        // SAFETY: `got` is a writable buffer of its length.
        let n = unsafe { libc::recv(peer.as_raw_fd(), got.as_mut_ptr().cast(), 16, 0) };
        assert_eq!(&got[..n as usize], b"0123456789");
        // A head more than the ring ahead of tail, or behind it, is a violation.
        ram.write_u32(head, tx.tail.wrapping_add(NET_TX_BYTES as u32 + 1))
            .unwrap();
        assert!(tx.send(&ram, ours.as_raw_fd()).is_err());
        ram.write_u32(head, tx.tail.wrapping_sub(1)).unwrap();
        assert!(tx.send(&ram, ours.as_raw_fd()).is_err());
        // A waiter that is not a tag + 1 is a violation once room was made.
        ram.write_u32(head, tx.tail.wrapping_add(1)).unwrap();
        ram.write_u32(waiter, u32::MAX).unwrap();
        assert!(tx.send(&ram, ours.as_raw_fd()).is_err());
    }
}
