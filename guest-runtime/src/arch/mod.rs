//! Architecture-specific parts, reached by the rest of the runtime only through the names
//! re-exported here: `cpu` (per-vCPU words, time, timer, IPIs), `context` (switches, new threads,
//! full contexts and their accessors), `rseq` (restartable sequences), `entry` (a new
//! activation's first instructions), `fault` (reading a CPU exception's frame), and the
//! protocol's context type and interrupt vectors. `current` is the architecture being built.
//! Shared by both: `word` (the per-vCPU words' layout), and the Rust side of what each
//! architecture writes in assembly: `sequences` (restartable sequences), `switch` (context
//! switches) and `entry_words` (a new activation's entry and its saved words).

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
mod entry_words;
mod sequences;
mod switch;
mod word;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64 as current;
#[cfg(target_arch = "x86_64")]
pub use x86_64 as current;

pub use current::{
    context, cpu, entry, fault, rseq, UserContext, RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ,
};
