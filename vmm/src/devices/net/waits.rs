//! Waits: arming one under the guest's tag (every call that would block), and `poll` and
//! `cancel` (`protocol::net::NET_OP_POLL`, `NET_OP_CANCEL`): a guest thread waits
//! for a socket's readiness without an operation (std's `connect_timeout` polls a connect in
//! progress), and takes back a wait whose deadline passed, so it knows whether a report of its
//! tag will still come (`guest-runtime/src/net_deadline.rs`).

use std::os::fd::AsRawFd;

use protocol::net::*;

use super::poll::epoll_update;
use super::{errno, neg, Kind, Net, Table};

impl Net {
    /// Watch socket `s` for reading or writing under `tag`: `NET_WAITING`, or `-EAGAIN` for
    /// `NET_NO_WAIT`.
    pub(super) fn arm(
        &self,
        table: &mut Table,
        s: usize,
        tag: u64,
        read: bool,
    ) -> Result<u64, String> {
        if tag == NET_NO_WAIT {
            return Ok(neg(libc::EAGAIN));
        }
        if tag >= NET_RING_CAPACITY as u64 {
            return Err(format!("tag {tag} is not below {NET_RING_CAPACITY}"));
        }
        if table.ring.is_none() {
            return Err("no net ring: call net_ring_setup first".into());
        }
        let (word, bit) = (tag as usize / 64, 1u64 << (tag % 64));
        if table.waiting[word] & bit != 0 {
            return Err(format!("tag {tag} is waiting already"));
        }
        let sock = table.socks[s].as_mut().expect("checked");
        let slot = if read {
            &mut sock.read_tag
        } else {
            &mut sock.write_tag
        };
        if slot.is_some() {
            return Ok(neg(libc::EBUSY));
        }
        *slot = Some(tag as u32);
        let data = (u64::from(sock.generation) << 32) | s as u64;
        if let Err(e) = epoll_update(&self.epoll, sock, data) {
            let sock = table.socks[s].as_mut().expect("checked");
            *(if read {
                &mut sock.read_tag
            } else {
                &mut sock.write_tag
            }) = None;
            return Ok(neg(e));
        }
        table.waiting[word] |= bit;
        Ok(NET_WAITING)
    }

    /// `poll(s, events, tag)`: `events` is exactly one of [`NET_READABLE`] or [`NET_WRITABLE`].
    /// The ready bits (`NET_READABLE`, `NET_WRITABLE`, `NET_ERROR`, `NET_HANGUP`, Linux's
    /// values) if any, else the wait is armed under `tag` (`NET_WAITING`, or `-EAGAIN` for
    /// `NET_NO_WAIT`). A direction the guest's receive buffer or transmit ring serves is
    /// `-EINVAL` (the guest looks there), a socket without a host socket (a fresh one, an
    /// unbound UDP socket) `-ENOTCONN`. TCP streams, listeners and UDP sockets.
    pub(super) fn poll(
        &self,
        table: &mut Table,
        s: usize,
        events: u64,
        tag: u64,
    ) -> Result<u64, String> {
        let sock = table.socks[s].as_ref().expect("checked");
        let read = match events {
            NET_READABLE => true,
            NET_WRITABLE => false,
            _ => return Ok(neg(libc::EINVAL)),
        };
        if (read && sock.rx.is_some()) || (!read && sock.tx.is_some()) {
            return Ok(neg(libc::EINVAL));
        }
        let fd = match (&sock.kind, &sock.fd) {
            (Kind::Stream | Kind::Listener { .. } | Kind::Datagram(_), Some(fd)) => fd.as_raw_fd(),
            _ => return Ok(neg(libc::ENOTCONN)),
        };
        let mut pfd = libc::pollfd {
            fd,
            events: if read { libc::POLLIN } else { libc::POLLOUT },
            revents: 0,
        };
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A vCPU thread is kicked with signals (a revoked processor, chaos): `EINTR` is retried,
        // never the guest's answer (it once made a listener look failed, `POLLERR`).
        loop {
            // SAFETY: one valid pollfd, a zero timeout (never blocks), no signal mask.
            if unsafe { libc::ppoll(&mut pfd, 1, &zero, std::ptr::null()) } >= 0 {
                break;
            }
            match errno() {
                libc::EINTR => continue,
                e => return Ok(neg(e)),
            }
        }
        let ready =
            (pfd.revents & (libc::POLLIN | libc::POLLOUT | libc::POLLERR | libc::POLLHUP)) as u64;
        if ready != 0 {
            return Ok(ready);
        }
        let slot = if read { sock.read_tag } else { sock.write_tag };
        if slot.is_some() && tag != NET_NO_WAIT {
            // Another thread waits for this direction already.
            return Ok(neg(libc::EAGAIN));
        }
        self.arm(table, s, tag, read)
    }

    /// `cancel(s, tag)`: 0 if `tag` was armed on `s` and is not any more (no report will
    /// come), `-ENOENT` if it is not armed there (its report is in the ring or on its way).
    pub(super) fn cancel(&self, table: &mut Table, s: usize, tag: u64) -> Result<u64, String> {
        if tag >= NET_RING_CAPACITY as u64 {
            return Err(format!(
                "cancel of tag {tag}, not below {NET_RING_CAPACITY}"
            ));
        }
        let tag = tag as u32;
        let sock = table.socks[s].as_mut().expect("checked");
        if sock.read_tag == Some(tag) {
            sock.read_tag = None;
        } else if sock.write_tag == Some(tag) {
            sock.write_tag = None;
        } else {
            return Ok(neg(libc::ENOENT));
        }
        table.waiting[tag as usize / 64] &= !(1u64 << (tag % 64));
        let data = (u64::from(sock.generation) << 32) | s as u64;
        // Registered for what is still wanted (a one-shot registration may stay armed without
        // a tag: its event then finds no tag and is dropped).
        let _ = epoll_update(&self.epoll, sock, data);
        Ok(0)
    }
}
