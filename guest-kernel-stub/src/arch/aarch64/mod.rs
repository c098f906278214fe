//! aarch64: TODO. Mirrors `arch/x86_64` module by module; nothing here is implemented yet, so
//! the stub does not build for aarch64 (the protocol side is ready: `protocol::arch::aarch64`).
//!
//! Plan: the guest's EL1 code is the counterpart of CPL0 (a handful of instructions per
//! exception), everything else runs at EL0.

pub(crate) mod boot;
pub(crate) mod hypercall;
pub mod irqchip;
pub mod percpu;
pub mod traps;
