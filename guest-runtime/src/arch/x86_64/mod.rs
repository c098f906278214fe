//! x86_64 (CPL3): see each module.

pub mod context;
pub mod cpu;
pub mod entry;
pub mod fault;
pub mod rseq;

pub use activm_stub::protocol::arch::x86_64::{UserContext, RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ};
