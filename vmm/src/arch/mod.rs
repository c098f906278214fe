//! Architecture-specific parts of the VMM, with the same shape on each architecture:
//! `layout` (where the VMM puts its boot structures), `boot` (building them in guest memory),
//! `vcpu` (initial vCPU state and register dumps).

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "aarch64")]
pub use aarch64 as current;

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64 as current;
