//! A stream's transmit ring as a hostile guest drives it, through the real send path into a
//! host socket (an `AF_UNIX` socket pair; with a small send buffer a send stops part way, with
//! the peer gone it fails): any ring address, indices that start anywhere (so they
//! wrap around `u32`), and between the VMM's sends any `head` or `waiter` value, scribbles on
//! the words the VMM owns (`tail`, `state`), or honest queueing. Checked against a model: the
//! VMM refuses (never panics on) a `head` more than the ring ahead of what it sent, or a
//! `waiter` that is not a tag + 1 when it reports one; it keeps its own `tail`; it reports the
//! waiter exactly when bytes went out or the ring failed; a failed ring drops what was queued
//! and says `EPIPE`; and every byte it sends reaches the peer, in ring order.
//!
//! Each step costs a few system calls at most: the guest writes and the model reads the data
//! area in at most two pieces, and each byte the peer receives is compared once. The sockets
//! are made once per process and emptied before each input: three pairs, with the default and
//! with a small send buffer, and one whose peer is closed.

#![no_main]

use std::cell::RefCell;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use activm::fuzzing::TxArea;
use activm_fuzz::{Guest, Input, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::net::{NetTx, NET_RING_CAPACITY, NET_TX_BYTES, NET_TX_ERROR};

const CAP: u32 = NET_TX_BYTES as u32;

/// The honest guest's bytes repeat after this many: far more than the ring holds, so a piece
/// sent from the wrong place shows.
const PATTERN_PERIOD: usize = 1 << 16;

/// The honest guest's bytes from every position in a period, plus one queueing's worth (made
/// once: a byte-by-byte loop per input costs more than the rest of it).
fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| {
        (0..PATTERN_PERIOD + MAX_QUEUE)
            .map(|x| (x ^ (x >> 8) ^ (x >> 16)) as u8)
            .collect()
    })
}

/// The most bytes one honest queueing step writes.
const MAX_QUEUE: usize = 4096;

/// A non-blocking stream socket pair; `small_buffer`: the first one's send buffer as small as
/// the kernel allows (a few KiB), so sends hit `EAGAIN`.
fn socket_pair(small_buffer: bool) -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors; the result is checked.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair");
    // SAFETY: fresh descriptors owned by nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    if small_buffer {
        let size: libc::c_int = 1;
        // SAFETY: `pair.0` is a live socket; `size` is a valid `c_int` option value.
        let r = unsafe {
            libc::setsockopt(
                pair.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "SO_SNDBUF");
    }
    pair
}

/// This process's socket pairs: (ours, peer) with the default send buffer, with a small one,
/// and ours of a pair whose peer is closed.
struct Sockets {
    default: (OwnedFd, OwnedFd),
    small: (OwnedFd, OwnedFd),
    dead: OwnedFd,
}

fn sockets() -> &'static Sockets {
    static SOCKETS: OnceLock<Sockets> = OnceLock::new();
    SOCKETS.get_or_init(|| Sockets {
        default: socket_pair(false),
        small: socket_pair(true),
        dead: socket_pair(false).0,
    })
}

/// Reads and drops whatever `fd` has to read.
fn empty(fd: RawFd) {
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is a writable buffer of its length.
    while unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) } > 0 {}
}

/// The ring in guest RAM, as the guest sees it.
struct Ring<'g> {
    guest: &'g Guest,
    gpa: u64,
}

impl Ring<'_> {
    fn word(&self, offset: usize) -> &AtomicU32 {
        self.guest
            .ram
            .atomic_u32(self.gpa + offset as u64)
            .expect("the ring lies in RAM")
    }

    fn head(&self) -> &AtomicU32 {
        self.word(offset_of!(NetTx, head))
    }

    fn tail(&self) -> &AtomicU32 {
        self.word(offset_of!(NetTx, tail))
    }

    fn state(&self) -> &AtomicU32 {
        self.word(offset_of!(NetTx, state))
    }

    fn waiter(&self) -> &AtomicU32 {
        self.word(offset_of!(NetTx, waiter))
    }

    /// The data area's pieces holding `len` bytes from free-running position `pos`:
    /// (guest address, length), at most two.
    fn pieces(&self, pos: u32, len: usize) -> [(u64, usize); 2] {
        let data = self.gpa + offset_of!(NetTx, data) as u64;
        let at = (pos % CAP) as usize;
        let first = len.min(NET_TX_BYTES - at);
        [(data + at as u64, first), (data, len - first)]
    }

    fn write_data(&self, pos: u32, mut bytes: &[u8]) {
        for (gpa, len) in self.pieces(pos, bytes.len()) {
            let (piece, rest) = bytes.split_at(len);
            self.guest.ram.write_bytes(gpa, piece).expect("in RAM");
            bytes = rest;
        }
    }

    fn read_data(&self, pos: u32, len: usize, into: &mut Vec<u8>) {
        for (gpa, len) in self.pieces(pos, len) {
            let piece = self.guest.ram.read_bytes(gpa, len as u64).expect("in RAM");
            into.extend_from_slice(&piece);
        }
    }
}

/// What the VMM should have done so far.
struct Model {
    /// The VMM's `tail`: bytes sent or dropped.
    tail: u32,
    /// Sending failed (the peer was gone).
    failed: bool,
    /// Where the VMM sends, and its peer while it is open.
    ours: RawFd,
    peer: Option<RawFd>,
    /// Bytes sent, in order; the peer read the first `received`.
    expected: Vec<u8>,
    received: usize,
    /// Bytes the honest guest queued, for their pattern.
    queued_total: u32,
}

impl Model {
    /// An honest guest queues up to `want` bytes where there is room (by its own count of
    /// what was sent) and publishes them.
    fn queue(&mut self, ring: &Ring, want: usize) {
        let head = ring.head().load(Ordering::SeqCst);
        let room = CAP.saturating_sub(head.wrapping_sub(self.tail)) as usize;
        let n = want.min(room);
        let at = self.queued_total as usize % PATTERN_PERIOD;
        ring.write_data(head, &pattern()[at..at + n]);
        self.queued_total = self.queued_total.wrapping_add(n as u32);
        ring.head()
            .store(head.wrapping_add(n as u32), Ordering::SeqCst);
    }

    /// A guest scribbles on the VMM's `tail` word: never a value the VMM's next send could
    /// store, so the model still sees whether it moved.
    fn scribble_tail(&self, ring: &Ring, value: u32) {
        let ahead = value.wrapping_sub(self.tail);
        let value = match (1..=CAP).contains(&ahead) {
            true => value.wrapping_add(CAP),
            false => value,
        };
        ring.tail().store(value, Ordering::SeqCst);
    }

    /// The VMM sends what is queued; checks what it did. Whether the guest lives on (`false`:
    /// the VMM refused the ring, which ends the guest).
    fn send(&mut self, ring: &Ring, tx: &mut TxArea) -> bool {
        let head = ring.head().load(Ordering::SeqCst);
        let waiter = ring.waiter().load(Ordering::SeqCst);
        let tail_word = ring.tail().load(Ordering::SeqCst);
        let queued = head.wrapping_sub(self.tail);
        let result = tx.send(&ring.guest.ram, self.ours);
        if !self.failed && queued > CAP {
            assert!(result.is_err(), "head {head} tail {} accepted", self.tail);
            return false;
        }
        let now = ring.tail().load(Ordering::SeqCst);
        let moved = match now == tail_word {
            true => 0,
            false => now.wrapping_sub(self.tail),
        };
        assert!(moved <= queued, "tail {now} moved past head {head}");
        if !self.failed && self.peer.is_none() && queued > 0 {
            assert_eq!(moved, queued, "a failed ring drops what was queued");
            let bits = NET_TX_ERROR | (libc::EPIPE as u32) << 16;
            assert_eq!(ring.state().load(Ordering::SeqCst) & bits, bits);
            self.failed = true;
        } else if self.failed {
            assert_eq!(moved, 0, "a failed ring sends nothing");
        } else {
            ring.read_data(self.tail, moved as usize, &mut self.expected);
        }
        self.tail = self.tail.wrapping_add(moved);
        let reports = moved > 0 || self.failed;
        if reports && waiter as usize > NET_RING_CAPACITY {
            assert!(result.is_err(), "waiter {waiter} accepted");
            return false;
        }
        let (empty, tag) = result.expect("an honest ring is sent");
        let left = ring.waiter().load(Ordering::SeqCst);
        match reports {
            true => assert_eq!((tag, left), (waiter.checked_sub(1), 0)),
            false => assert_eq!((tag, left), (None, waiter)),
        }
        assert_eq!(empty, self.failed || moved == queued, "empty");
        true
    }

    /// The peer reads what arrived: every byte sent, in order.
    fn drain(&mut self) {
        thread_local! {
            /// The peer's receive buffer (zeroed once, not per input).
            static BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; NET_TX_BYTES]);
        }
        let Some(peer) = self.peer else {
            return;
        };
        BUF.with_borrow_mut(|buf| self.receive(peer, buf));
        assert_eq!(
            self.received,
            self.expected.len(),
            "sent bytes went missing"
        );
        self.expected.clear();
        self.received = 0;
    }

    fn receive(&mut self, peer: RawFd, buf: &mut [u8]) {
        loop {
            // SAFETY: `buf` is a writable buffer of its length.
            let n = unsafe { libc::recv(peer, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            let want = self.expected.get(self.received..self.received + n);
            assert_eq!(Some(&buf[..n]), want, "bytes out of ring order");
            self.received += n;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    static GUEST: OnceLock<Guest> = OnceLock::new();
    let guest = GUEST.get_or_init(|| Guest::new(1));
    let mut input = Input(data);
    let setup = input.u8();
    let image = guest.plan.image.start;
    let gpa = match setup % 4 {
        0 => input.number(),
        _ => (image + input.u32() as u64 % (MEM_SIZE - image)) & !63,
    };
    let Ok(mut tx) = TxArea::new(&guest.ram, image, gpa) else {
        return;
    };
    let start = input.number() as u32;
    tx.start_at(&guest.ram, start);
    let ring = Ring { guest, gpa };
    let sockets = sockets();
    let (ours, peer) = match setup & 4 {
        0 => &sockets.default,
        _ => &sockets.small,
    };
    // Whatever an input that ended early left in it.
    empty(peer.as_raw_fd());
    let mut model = Model {
        tail: start,
        failed: false,
        ours: ours.as_raw_fd(),
        peer: Some(peer.as_raw_fd()),
        expected: Vec::new(),
        received: 0,
        queued_total: 0,
    };
    while !input.is_empty() {
        match input.u8() % 8 {
            0 => ring.head().store(input.u32(), Ordering::SeqCst),
            1 => {
                let value = input.u32() % (NET_RING_CAPACITY as u32 + 2);
                ring.waiter().store(value, Ordering::SeqCst);
            }
            2 | 3 => model.queue(&ring, input.u32() as usize % (MAX_QUEUE + 1)),
            4 => {
                if !model.send(&ring, &mut tx) {
                    return;
                }
            }
            5 => model.drain(),
            6 => match input.u8() % 2 {
                0 => model.scribble_tail(&ring, input.u32()),
                _ => ring.state().store(input.u32(), Ordering::SeqCst),
            },
            _ => {
                if input.u8() % 8 == 0 {
                    // The peer reads what arrived, then goes away.
                    model.drain();
                    model.peer = None;
                    model.ours = sockets.dead.as_raw_fd();
                }
            }
        }
    }
    model.drain();
});
