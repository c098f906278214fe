//! Per-architecture parts of the ABI. Both modules are always compiled (so their layout tests
//! run on any host); `current` is the one for the architecture being built.

pub mod aarch64;
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64 as current;
#[cfg(not(target_arch = "aarch64"))]
pub use x86_64 as current;
