//! aarch64 (EL0): not written yet; the modules say what each will hold. The stub has no aarch64
//! side either (`guest-kernel-stub/src/arch/aarch64`).

pub mod context;
pub mod cpu;
pub mod rseq;
