//! Architecture-specific parts of the VMM, with the same shape on each architecture:
//! `layout` (where the VMM puts its boot structures), `boot` (building them in guest memory),
//! `vcpu` (initial vCPU state and register dumps), `context` (a vCPU's user context: the
//! hand-over test, taking it, entering a new activation), `exit` (hypercall arguments and
//! result, halting, the timestamp counter).
//!
//! Shared code reaches an architecture only through [`current`], whose list below is the whole
//! surface a port has to provide.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;

#[cfg(target_arch = "x86_64")]
pub mod x86_64;

pub mod current;
pub mod layout;
