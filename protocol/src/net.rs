//! Sockets through the VMM (a socket proxy): the guest names host sockets by small numbers,
//! the VMM performs each operation on a non-blocking host socket and reports readiness through
//! a ring in guest memory.
//!
//! One hypercall, `net(op << 32 | socket, a1, a2, a3)` ([`crate::hypercall::Hypercall::Net`]),
//! returns a value or `-errno` (Linux numbers) as a two's-complement `u64`. An operation that
//! would block and was given a wait tag (`tag < NET_RING_CAPACITY`) returns [`NET_WAITING`]:
//! the VMM then watches the socket and, when it is ready, puts `(tag, events)` into the
//! [`NetRing`] registered with `net_ring_setup(gpa)`; the guest retries the operation then.
//! With [`NET_NO_WAIT`] as tag it returns `-EAGAIN` instead.
//!
//! Addresses are IPv4 only, packed in a `u64` as [`pack_addr`]: `ip << 16 | port`, the IP in
//! host order (`127.0.0.1` is `0x7f00_0001`). What the guest may reach is the VMM's to decide
//! (`--publish`, `--allow-connect`): anything else is `-EACCES`.

use core::sync::atomic::AtomicU32;

use crate::CacheAligned;

/// `socket(kind)`: a new TCP socket (`kind` [`NET_KIND_TCP`]); returns its number.
pub const NET_OP_SOCKET: u64 = 0;
/// `bind(s, addr)`: the guest address; only a published port (`--publish`) may be bound.
pub const NET_OP_BIND: u64 = 1;
/// `listen(s, backlog)`.
pub const NET_OP_LISTEN: u64 = 2;
/// `accept(s, tag, peer_gpa, rx_gpa)`: a new socket's number; its peer's packed address is
/// written as a `u64` at `peer_gpa` (if not 0); a [`NetRx`] at `rx_gpa` (if not 0) becomes the
/// new socket's receive buffer, as with [`NET_OP_RX_SETUP`].
pub const NET_OP_ACCEPT: u64 = 3;
/// `connect(s, addr, tag)`: 0 once connected (retry after the wait gives the outcome).
pub const NET_OP_CONNECT: u64 = 4;
/// `recv(s, gpa, len, tag | flags << 32)`: bytes received, 0 at end of stream. Flags:
/// [`NET_MSG_PEEK`].
pub const NET_OP_RECV: u64 = 5;
/// `send(s, gpa, len, tag)`: bytes sent.
pub const NET_OP_SEND: u64 = 6;
/// `shutdown(s, how)`: `how` 0 read, 1 write, 2 both.
pub const NET_OP_SHUTDOWN: u64 = 7;
/// `close(s)`.
pub const NET_OP_CLOSE: u64 = 8;
/// `getsockname(s)`: the packed local address (as the guest sees it).
pub const NET_OP_SOCKNAME: u64 = 9;
/// `getpeername(s)`: the packed peer address.
pub const NET_OP_PEERNAME: u64 = 10;
/// `setopt(s, opt, value)`: [`NET_OPT_NODELAY`].
pub const NET_OP_SETOPT: u64 = 11;
/// `getopt(s, opt)`: the value of [`NET_OPT_NODELAY`] or [`NET_OPT_ERROR`] (a pending
/// error as a positive errno, 0 if none).
pub const NET_OP_GETOPT: u64 = 12;

/// `rx_resume(s)`: the guest made room in a receive buffer the VMM marked
/// [`NET_RX_STALLED`]; the VMM reads ahead again.
pub const NET_OP_RX_RESUME: u64 = 13;
/// `rx_setup(s, rx_gpa)`: a connected stream's receive buffer, a [`NetRx`] at `rx_gpa`
/// (64-byte aligned, in RAM at or above the image base). From then on the VMM receives ahead
/// into it and `recv` on this socket is `-EINVAL`.
pub const NET_OP_RX_SETUP: u64 = 14;
/// `tx_setup(s, tx_gpa)`: a connected stream's transmit ring, a [`NetTx`] at `tx_gpa` (64-byte
/// aligned, in RAM at or above the image base). From then on the guest queues its bytes there
/// and `send` on this socket is `-EINVAL`.
pub const NET_OP_TX_SETUP: u64 = 15;
/// `tx_flush(s, tag)`: the doorbell of a transmit ring: the VMM sends what is queued. 0 once
/// the ring is empty, `-errno` if the stream failed; when the host socket is full, the VMM
/// keeps sending as it drains and the answer is [`NET_WAITING`] (`tag` reported when it can
/// take more) or `-EAGAIN` for [`NET_NO_WAIT`].
pub const NET_OP_TX_FLUSH: u64 = 16;
/// `tx_flush_all()`: one doorbell for every transmit ring (the socket number is ignored): the
/// VMM sends what each has queued, as far as the host sockets take it (a full one is sent as
/// it drains). Returns 0.
pub const NET_OP_TX_FLUSH_ALL: u64 = 17;

/// `udp_sendto(s, gpa, len | tag << 32, addr)`: one datagram of `len` bytes (at most
/// [`NET_UDP_MAX`], else `-EMSGSIZE`) to the packed `addr`, or to the connected peer if `addr`
/// is 0 (`-EDESTADDRREQ` if none); the bytes sent. A UDP socket only (else `-EINVAL`). ABI 6.
pub const NET_OP_UDP_SENDTO: u64 = 18;
/// `udp_recvfrom(s, gpa, len | tag << 32, peer_gpa)`: takes one datagram, its first `len`
/// bytes into `gpa` (the rest is dropped, as Linux does); the bytes copied. The sender's
/// packed address is written as a `u64` at `peer_gpa` (if not 0). ABI 6.
pub const NET_OP_UDP_RECVFROM: u64 = 19;
/// `udp_peekfrom(s, gpa, len | tag << 32, peer_gpa)`: [`NET_OP_UDP_RECVFROM`] without taking
/// the datagram. ABI 6.
pub const NET_OP_UDP_PEEKFROM: u64 = 20;
/// `udp_connect(s, addr)`: the default peer of `udp_sendto` with `addr` 0; from then on only
/// its datagrams are received. Never waits. ABI 6.
pub const NET_OP_UDP_CONNECT: u64 = 21;
/// `poll(s, events, tag)`: `events` one of [`NET_READABLE`] or [`NET_WRITABLE`]; the ready
/// bits ([`NET_READABLE`] ... [`NET_HANGUP`]) if any, else waits like `recv` (`NET_WAITING`,
/// the tag reported when the socket is ready; `-EAGAIN` for [`NET_NO_WAIT`]). A direction a
/// receive buffer or transmit ring serves is `-EINVAL`. TCP and (since 2026-11-29) UDP
/// sockets with a host socket; `-ENOTCONN` without one. Additive: ABI version unchanged.
pub const NET_OP_POLL: u64 = 24;
/// `cancel(s, tag)`: takes back a wait armed on `s` under `tag`: 0 if no report will come,
/// `-ENOENT` if the VMM reported it already (it is in the ring or on its way). A tag out of
/// range is a protocol violation. Additive: ABI version unchanged.
pub const NET_OP_CANCEL: u64 = 25;

/// `socket`'s kind: a TCP stream.
pub const NET_KIND_TCP: u64 = 1;
/// `socket`'s kind: a UDP socket (ABI 6).
pub const NET_KIND_UDP: u64 = 2;
/// The largest UDP datagram over IPv4 (65,535 - 8 - 20 bytes).
pub const NET_UDP_MAX: u64 = 65_507;
/// Options of `setopt` / `getopt`.
pub const NET_OPT_NODELAY: u64 = 1;
pub const NET_OPT_ERROR: u64 = 2;
/// `recv` flag (in the high half of its fourth argument): look without consuming.
pub const NET_MSG_PEEK: u64 = 1;

/// The operation would block: the VMM reports readiness under the given tag.
pub const NET_WAITING: u64 = 0x7fff_ffff_ffff_f000;
/// A tag meaning "do not wait": the operation returns `-EAGAIN` instead.
pub const NET_NO_WAIT: u64 = 0xffff_ffff;

/// Readiness bits in a completion (Linux `EPOLLIN`, `EPOLLOUT`, `EPOLLERR`, `EPOLLHUP`).
pub const NET_READABLE: u64 = 0x1;
pub const NET_WRITABLE: u64 = 0x4;
pub const NET_ERROR: u64 = 0x8;
pub const NET_HANGUP: u64 = 0x10;

/// Most sockets a guest may have open at once.
pub const NET_MAX_SOCKETS: usize = 1024;

/// Wait tags (`0..NET_RING_CAPACITY`) and completions in a [`NetRing`].
pub const NET_RING_CAPACITY: usize = 256;

/// `net(op << 32 | socket, ...)`'s first argument.
pub const fn net_arg(op: u64, socket: u64) -> u64 {
    (op << 32) | (socket & 0xffff_ffff)
}

/// An IPv4 address and port, packed: `ip << 16 | port` (`ip` in host order).
pub const fn pack_addr(ip: u32, port: u16) -> u64 {
    ((ip as u64) << 16) | port as u64
}

/// The IP (host order) and port of a packed address.
pub const fn unpack_addr(packed: u64) -> (u32, u16) {
    ((packed >> 16) as u32, packed as u16)
}

/// One readiness report.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCompletion {
    /// The tag the waiting operation was given.
    pub tag: u64,
    /// `NET_READABLE | NET_WRITABLE | NET_ERROR | NET_HANGUP` bits.
    pub events: u64,
}

/// The readiness ring: guest memory registered with `net_ring_setup(gpa)` (64-byte aligned,
/// in RAM at or above the image base). The same protocol as [`crate::blk::BlkRing`]: the VMM
/// writes `entries[head % CAP]`, then `head + 1` with release; the guest takes
/// `entries[tail..head]` and stores `tail`. A tag is in at most one wait or unconsumed
/// completion, so the ring never overflows. After publishing, the VMM interrupts one vCPU the
/// guest marks idle (`SharedHeader::idle_vcpus`), never a busy one.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct NetRing {
    /// VMM writes: producer index (free-running).
    pub head: CacheAligned<AtomicU32>,
    /// Guest writes: consumer index (free-running).
    pub tail: CacheAligned<AtomicU32>,
    /// VMM writes.
    pub entries: [NetCompletion; NET_RING_CAPACITY],
    /// VMM writes: [`NET_SENDER_POLLING`] while its sender looks at the transmit rings by
    /// itself; a guest that queued bytes (`NetTx::head`, sequentially consistent) and then
    /// reads 0 here rings the doorbell (`tx_flush`). The VMM stores 0, then looks at every
    /// ring once more before it sleeps: one side always sees the other.
    pub sender: CacheAligned<AtomicU32>,
}

impl NetRing {
    pub const fn new() -> NetRing {
        NetRing {
            head: CacheAligned(AtomicU32::new(0)),
            tail: CacheAligned(AtomicU32::new(0)),
            entries: [NetCompletion { tag: 0, events: 0 }; NET_RING_CAPACITY],
            sender: CacheAligned(AtomicU32::new(0)),
        }
    }
}

impl Default for NetRing {
    fn default() -> NetRing {
        NetRing::new()
    }
}

/// [`NetRing::sender`]: the VMM is awake and sends queued bytes without a doorbell.
pub const NET_SENDER_POLLING: u32 = 1;

/// The value the guest stores to ring the transmit doorbell (the ioeventfd matches it; with
/// [`crate::shared::SHARED_FEATURE_NET_DOORBELL`]).
pub const NET_DOORBELL_RING: u32 = 1;

/// The transmit doorbell: a 4-byte store of [`NET_DOORBELL_RING`] to the `net` hypercall's slot
/// (a load there is the `net` call itself). The VMM's net thread then sends every transmit
/// ring, as `tx_flush_all` would on the vCPU's thread, but the vCPU does not exit to the VMM.
pub const fn net_doorbell_address(hypercall_base: u64) -> u64 {
    crate::hypercall::Hypercall::Net.address(hypercall_base)
}

/// Bytes in a [`NetRx`] buffer.
pub const NET_RX_BYTES: usize = 16 * 1024;
/// [`NetRx::state`] bits (VMM writes): the peer closed (after the buffered bytes, `recv`
/// returns 0); the buffer was full and the VMM stopped reading (the guest calls `rx_resume`
/// after making room); a receive error, its errno in bits 16 and up.
pub const NET_RX_EOF: u32 = 1;
pub const NET_RX_STALLED: u32 = 2;
pub const NET_RX_ERROR: u32 = 4;

/// A stream socket's receive buffer in guest memory: the VMM's net thread receives into it
/// whenever the host socket has data, so a `recv` that finds bytes here makes no exit.
///
/// The VMM writes `data[head % N ..]`, then `head` (bytes received, free-running) with
/// release; the guest copies `data[tail..head]` and stores `tail`. A guest thread that finds
/// it empty stores a free wait tag + 1 in `waiter`, then looks again (both sides use
/// sequentially consistent order on `head`/`state`/`waiter`); after each fill the VMM swaps
/// `waiter` to 0 and, if it held a tag, reports it in the [`NetRing`].
#[repr(C, align(64))]
#[derive(Debug)]
pub struct NetRx {
    /// VMM writes: bytes received (free-running).
    pub head: CacheAligned<AtomicU32>,
    /// Guest writes: bytes consumed (free-running).
    pub tail: CacheAligned<AtomicU32>,
    /// VMM writes: `NET_RX_*` bits.
    pub state: AtomicU32,
    /// Guest writes a tag + 1; the VMM swaps in 0 when it reports the tag.
    pub waiter: AtomicU32,
    _pad: [u32; 14],
    /// VMM writes.
    pub data: [u8; NET_RX_BYTES],
}

impl NetRx {
    pub const fn new() -> NetRx {
        NetRx {
            head: CacheAligned(AtomicU32::new(0)),
            tail: CacheAligned(AtomicU32::new(0)),
            state: AtomicU32::new(0),
            waiter: AtomicU32::new(0),
            _pad: [0; 14],
            data: [0; NET_RX_BYTES],
        }
    }
}

impl Default for NetRx {
    fn default() -> NetRx {
        NetRx::new()
    }
}

/// Bytes in a [`NetTx`] ring.
pub const NET_TX_BYTES: usize = 16 * 1024;
/// [`NetTx::state`] bit (VMM writes): sending failed, its errno in bits 16 and up; queued
/// bytes are dropped and every later `send` fails.
pub const NET_TX_ERROR: u32 = 4;

/// A stream socket's transmit ring in guest memory: `send` queues bytes here and the VMM sends
/// them, so a `send` makes no exit while the VMM's sender is awake ([`NetRing::sender`]).
///
/// The guest writes `data[head % N ..]`, then `head` (bytes queued, free-running); the VMM
/// sends `data[tail..head]` and stores `tail` (bytes sent). A guest thread that finds the ring
/// full stores a free wait tag + 1 in `waiter` and looks at `tail` again (sequentially
/// consistent order on both sides); after sending, the VMM swaps `waiter` to 0 and, if it held
/// a tag, reports it in the [`NetRing`]. The VMM checks `head - tail <= N` on every look.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct NetTx {
    /// Guest writes: bytes queued (free-running).
    pub head: CacheAligned<AtomicU32>,
    /// VMM writes: bytes sent (free-running).
    pub tail: CacheAligned<AtomicU32>,
    /// VMM writes: [`NET_TX_ERROR`] and an errno.
    pub state: AtomicU32,
    /// Guest writes a tag + 1; the VMM swaps in 0 when it reports the tag.
    pub waiter: AtomicU32,
    _pad: [u32; 14],
    /// Guest writes.
    pub data: [u8; NET_TX_BYTES],
}

impl NetTx {
    pub const fn new() -> NetTx {
        NetTx {
            head: CacheAligned(AtomicU32::new(0)),
            tail: CacheAligned(AtomicU32::new(0)),
            state: AtomicU32::new(0),
            waiter: AtomicU32::new(0),
            _pad: [0; 14],
            data: [0; NET_TX_BYTES],
        }
    }
}

impl Default for NetTx {
    fn default() -> NetTx {
        NetTx::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn ring_layout_and_values() {
        assert_eq!(offset_of!(NetRing, head), 0);
        assert_eq!(offset_of!(NetRing, tail), 64);
        assert_eq!(offset_of!(NetRing, entries), 128);
        assert_eq!(offset_of!(NetRing, sender), 128 + 16 * NET_RING_CAPACITY);
        assert_eq!(size_of::<NetRing>(), 192 + 16 * NET_RING_CAPACITY);
        assert_eq!(net_arg(NET_OP_RECV, 7), (5 << 32) | 7);
        assert_eq!(offset_of!(NetRx, head), 0);
        assert_eq!(offset_of!(NetRx, tail), 64);
        assert_eq!(offset_of!(NetRx, state), 128);
        assert_eq!(offset_of!(NetRx, waiter), 132);
        assert_eq!(offset_of!(NetRx, data), 192);
        assert_eq!(size_of::<NetRx>(), 192 + NET_RX_BYTES);
        assert_eq!((NET_OP_RX_RESUME, NET_OP_RX_SETUP), (13, 14));
        assert_eq!(
            (NET_OP_TX_SETUP, NET_OP_TX_FLUSH, NET_OP_TX_FLUSH_ALL),
            (15, 16, 17)
        );
        assert_eq!((NET_OP_POLL, NET_OP_CANCEL), (24, 25));
        assert_eq!(offset_of!(NetTx, head), 0);
        assert_eq!(offset_of!(NetTx, tail), 64);
        assert_eq!(offset_of!(NetTx, state), 128);
        assert_eq!(offset_of!(NetTx, waiter), 132);
        assert_eq!(offset_of!(NetTx, data), 192);
        assert_eq!(size_of::<NetTx>(), 192 + NET_TX_BYTES);
        assert_eq!(
            (
                NET_OP_UDP_SENDTO,
                NET_OP_UDP_RECVFROM,
                NET_OP_UDP_PEEKFROM,
                NET_OP_UDP_CONNECT
            ),
            (18, 19, 20, 21)
        );
        assert_eq!((NET_KIND_TCP, NET_KIND_UDP, NET_UDP_MAX), (1, 2, 65_507));
        assert_eq!(pack_addr(0x7f00_0001, 6379), 0x7f00_0001_18eb);
        assert_eq!(unpack_addr(0x7f00_0001_18eb), (0x7f00_0001, 6379));
        assert_eq!(
            (NET_OP_SOCKET, NET_OP_CLOSE, NET_OP_GETOPT, NET_WAITING),
            (0, 8, 12, 0x7fff_ffff_ffff_f000)
        );
    }
}
