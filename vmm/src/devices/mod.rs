//! Emulated devices. Each is reached through hypercalls (there is no device MMIO or port I/O).
//!
//! * [`blk`]: a block device backed by a host file, whose slow requests block the vCPU in the
//!   VMM (the source of BLOCKED / UNBLOCKED upcalls).
//! * [`blk_async`]: the same device's asynchronous requests: a completion ring in guest
//!   memory and I/O threads; the vCPU never blocks.
//! * [`fs`], [`fs_path`]: host directories mapped into the guest (`--mount`), the `fs_*` calls;
//!   a slow one (a cold read, an `fsync`) blocks the vCPU as a slow block request does.
//! * [`net`]: sockets through host sockets, readiness through a ring (a socket proxy).

pub mod blk;
pub mod blk_async;
pub mod fs;
pub mod fs_path;
pub mod net;

/// What a vCPU blocked in the VMM waits for (`vcpu::ExitAction::Block`).
#[derive(Debug)]
pub enum Blocking {
    /// A block-device request (`blk::Disk::finish`).
    Disk(blk::Pending),
    /// A file call that may wait for the host (`fs::SlowCall::perform`).
    File(fs::SlowCall),
}
