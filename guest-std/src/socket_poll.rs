//! Non-blocking connects: a `connect` that would wait answers `EINPROGRESS` (std's
//! `connect_timeout`, mio), and `poll(POLLOUT)` (`crate::poll`) says when it is done; the
//! socket then gets its receive buffer and transmit ring.

use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::protocol::net::*;

use crate::errno::fail;
use crate::socket_call::net;

const EINPROGRESS: i32 = 115;
const POLLERR: i16 = 0x8;
const POLLHUP: i16 = 0x10;

/// Sockets whose non-blocking connect is in progress (their buffers are set up once `poll`
/// sees it done), one bit per socket number.
static CONNECTING: [AtomicU64; NET_MAX_SOCKETS / 64] =
    [const { AtomicU64::new(0) }; NET_MAX_SOCKETS / 64];

fn bit(s: u64) -> (&'static AtomicU64, u64) {
    (&CONNECTING[s as usize / 64], 1 << (s % 64))
}

/// A non-blocking connect of `s` would wait: `EINPROGRESS`, as on Linux.
pub fn connect_started(s: u64) -> i32 {
    let (word, b) = bit(s);
    word.fetch_or(b, Ordering::Relaxed);
    fail(EINPROGRESS)
}

/// `s` is closed or connected: no connect in progress.
pub fn forget(s: u64) {
    let (word, b) = bit(s);
    word.fetch_and(!b, Ordering::Relaxed);
}

/// `poll` saw `s` writable (`revents`): a connect in progress ended; connected, it gets its
/// receive buffer and transmit ring.
pub fn connect_done(s: u64, revents: i16) {
    let (word, b) = bit(s);
    if word.fetch_and(!b, Ordering::Relaxed) & b != 0
        && revents & (POLLERR | POLLHUP) == 0
        && net(NET_OP_GETOPT, s, NET_OPT_ERROR, 0, 0) == 0
    {
        crate::socket_rx::set_up(s);
        crate::socket_tx::set_up(s);
    }
}
