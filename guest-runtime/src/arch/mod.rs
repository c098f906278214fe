//! Architecture-specific parts: `cpu` (per-vCPU words, TSC, timer, IPIs), `context` (switches,
//! new threads, full contexts), `rseq` (restartable sequences). `aarch64` mirrors the module
//! names; it is documentation only for now.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::*;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;
