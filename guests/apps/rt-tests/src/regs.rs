//! Register state that must survive preemption, per architecture: `RegState::new(seed)`,
//! `hold(iterations)` (load known values, spin without changing them, store them) and `check`.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::{undefined_instruction, RegState, HOLD_SPINS};
#[cfg(target_arch = "x86_64")]
pub use x86_64::{undefined_instruction, RegState, HOLD_SPINS};
