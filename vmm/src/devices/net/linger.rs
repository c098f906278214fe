//! Bytes a guest queued but the host socket had no room for when the guest closed the stream
//! or exited. A Linux `close` returns at once and the kernel sends what was written; here the
//! bytes still sit in the guest's transmit ring, which the guest frees after `close`. So `close`
//! copies them out and keeps the host socket open ("lingering") until the net thread has sent
//! them (`EPOLLOUT`, edge-triggered), or the peer fails. At guest exit every ring is sent once
//! more into a send buffer grown to take it: the kernel delivers it after the VMM closes them.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use protocol::net::NET_TX_BYTES;

use super::opts::{int_option, set_int_option};
use super::{errno, Net, Table};
use crate::memory::GuestRam;

/// Marks an epoll registration as a lingering socket's (the low 32 bits are its key).
pub(super) const LINGER_EVENT: u64 = 1 << 63;

/// A closed stream's host socket with the bytes it still has to send.
#[derive(Debug)]
pub(super) struct Linger {
    fd: OwnedFd,
    bytes: Vec<u8>,
    sent: usize,
}

/// Lingering sockets by key.
#[derive(Debug, Default)]
pub(super) struct Lingering {
    socks: HashMap<u32, Linger>,
    next: u32,
}

impl Linger {
    /// Sends until done or the socket is full; whether it is finished (all sent, or failed).
    fn send(&mut self) -> bool {
        while self.sent < self.bytes.len() {
            let rest = &self.bytes[self.sent..];
            // SAFETY: `rest` is a live slice; `fd` is a socket this entry owns.
            let r = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if r > 0 {
                self.sent += r as usize;
                continue;
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return false,
                // The peer is gone: nothing more can reach it.
                _ => return true,
            }
        }
        true
    }
}

impl Net {
    /// Keeps `fd` open until `bytes` are sent (after one try now): at most one ring's worth per
    /// closed stream, and at most `NET_MAX_SOCKETS` lingering sockets (beyond, the rest is
    /// dropped: the guest can close and reopen streams faster than a peer reads).
    pub(super) fn linger(&self, table: &mut Table, fd: OwnedFd, bytes: Vec<u8>) {
        let mut entry = Linger { fd, bytes, sent: 0 };
        if entry.send() || table.lingering.socks.len() >= protocol::net::NET_MAX_SOCKETS {
            return;
        }
        let key = table.lingering.next;
        table.lingering.next = key.wrapping_add(1);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLOUT | libc::EPOLLET) as u32,
            u64: LINGER_EVENT | u64::from(key),
        };
        // SAFETY: both descriptors are live; `ev` is a valid event.
        let r = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                entry.fd.as_raw_fd(),
                &mut ev,
            )
        };
        if r == 0 {
            table.lingering.socks.insert(key, entry);
        }
    }

    /// The net thread: a lingering socket has room (or failed).
    pub(super) fn linger_event(&self, table: &mut Table, data: u64) {
        let key = data as u32;
        if let Some(entry) = table.lingering.socks.get_mut(&key) {
            if entry.send() {
                // Closing the descriptor removes its registration.
                table.lingering.socks.remove(&key);
            }
        }
    }

    /// The guest exits (on its vCPU thread): send what every transmit ring and lingering
    /// socket still holds, once, before the VMM closes the host sockets. Each socket's send
    /// buffer first grows by what it may still have to take (the VMM does not wait for a slow
    /// peer), so the kernel holds every byte and delivers it after the VMM has exited, as it
    /// would a Linux process's.
    pub fn flush_at_exit(&self, ram: &GuestRam) {
        let mut table = self.lock();
        for s in table.tx_socks.clone() {
            if let Some(Some(sock)) = table.socks.get(s) {
                if let (Some(_), Some(fd)) = (&sock.tx, &sock.fd) {
                    grow_send_buffer(fd.as_raw_fd(), NET_TX_BYTES);
                }
            }
            // A protocol violation here changes nothing: the guest is over.
            let _ = self.send_queued(ram, &mut table, s);
        }
        for entry in table.lingering.socks.values_mut() {
            grow_send_buffer(entry.fd.as_raw_fd(), entry.bytes.len() - entry.sent);
            entry.send();
        }
    }
}

/// Lets `fd`'s send buffer take `bytes` more than it holds now (twice that, for the kernel's
/// bookkeeping per buffer); never shrinks it. The kernel caps it at `net.core.wmem_max`.
fn grow_send_buffer(fd: RawFd, bytes: usize) {
    let get = || int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).ok();
    let set = |size| {
        let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, size);
    };
    // Linux reports twice the size it was given, and doubles what it is given.
    let Some(now) = get() else { return };
    let more = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set((now / 2).saturating_add(more));
    if get().is_some_and(|after| after < now) {
        // Capped below what autotuning had reached: keep the old size.
        set(now / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_lingering_socket_sends_the_rest_as_room_comes() {
        let (ours, mut peer) = UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("nonblocking");
        let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut entry = Linger {
            fd: OwnedFd::from(ours),
            bytes: bytes.clone(),
            sent: 0,
        };
        assert!(!entry.send(), "a megabyte does not fit a socket buffer");
        assert!(entry.sent > 0 && entry.sent < bytes.len());
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 65536];
        while got.len() < bytes.len() {
            let n = peer.read(&mut chunk).expect("read");
            got.extend_from_slice(&chunk[..n]);
            entry.send();
        }
        assert!(entry.send());
        assert_eq!(got, bytes);
        drop(entry);
        assert_eq!(
            peer.read(&mut chunk).expect("end"),
            0,
            "closed after the last byte"
        );
    }

    #[test]
    fn a_full_socket_takes_a_ring_more_at_exit() {
        let (ours, _peer) = UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("nonblocking");
        let fill = vec![7u8; 4096];
        let mut entry = Linger {
            fd: OwnedFd::from(ours),
            bytes: fill.clone(),
            sent: 0,
        };
        // Fill the socket until it refuses (the peer never reads).
        while entry.send() {
            entry.sent = 0;
        }
        let ring = vec![9u8; NET_TX_BYTES];
        entry.bytes = ring;
        entry.sent = 0;
        assert!(!entry.send(), "a full socket refuses the ring");
        grow_send_buffer(entry.fd.as_raw_fd(), NET_TX_BYTES);
        assert!(
            entry.send(),
            "after growing, the socket takes the whole ring"
        );
    }
}
