//! A checked block request ([`Request`]): what the device performs (`blk.rs`) and what the
//! asynchronous queue holds for its I/O threads (`blk_async/`).

use std::time::Instant;

/// A checked request that could not complete inside its exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Its data waits for the host (a cold read, a flush): it must be performed.
    Data(Request),
    /// Its data moved; the device's emulated latency ends at `due`, then `result` is final.
    Latency { result: u64, due: Instant },
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
}

/// One checked request: `count` sectors from `sector`, to or from guest-physical `gpa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub sector: u64,
    pub gpa: u64,
    pub count: u64,
}
