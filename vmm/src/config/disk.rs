//! `--disk PATH` and its options (`disk`, `io_latency`, `io_inline_wait` in a file): how a
//! guest's block device is set up, and the limits the configuration checks. `devices::blk`
//! opens it.

use std::path::PathBuf;
use std::time::Duration;

/// How a guest's disk is set up (`activm run --disk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub read_only: bool,
    /// Added to every read and write (an emulated slow device).
    pub latency: Duration,
    /// A request whose emulated latency ends within this after its data moved is waited for
    /// inside the exit instead of blocking (`--io-inline-wait`).
    pub inline_wait: Duration,
}

/// The default inline wait: below what blocking costs. A blocking request's BLOCKED, new
/// activation and UNBLOCKED cost ~45 us of guest time on this host (a 1 us device: 73.0 us a
/// read against 29.4 us for an oblivious vCPU that sleeps in the exit), an asynchronous
/// request's later completion a wake-up of tens of microseconds; QEMU's I/O threads poll up to
/// 32 us by default for the same reason.
pub const DEFAULT_INLINE_WAIT: Duration = Duration::from_micros(25);
/// Longest inline wait accepted: the vCPU keeps its processor while it waits.
pub const MAX_INLINE_WAIT: Duration = Duration::from_millis(1);

/// Longest emulated latency accepted (a stuck guest must still be stoppable quickly).
pub const MAX_LATENCY: Duration = Duration::from_secs(10);
