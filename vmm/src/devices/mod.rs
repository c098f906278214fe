//! Emulated devices. Each is reached through hypercalls (there is no device MMIO or port I/O).
//!
//! * [`blk`]: a block device backed by a host file, whose slow requests block the vCPU in the
//!   VMM (the source of BLOCKED / UNBLOCKED upcalls).

pub mod blk;
