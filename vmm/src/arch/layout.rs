//! Where the VMM puts its boot structures, for the architecture activm is built for: constants
//! only (RAM's plan reads them), so this path imports nothing of the VMM.

#[cfg(target_arch = "aarch64")]
pub use super::aarch64::layout::*;
#[cfg(target_arch = "x86_64")]
pub use super::x86_64::layout::*;
