//! x86_64 (CPL3): see each module.

pub mod context;
pub mod cpu;
pub mod rseq;
