//! aarch64 (EL0): see each module. What the stub gives this port, and how it differs from
//! x86_64:
//!
//! * Interrupts reach EL0 with the EOI already done at EL1, on the interrupted stack, as a
//!   `protocol::arch::aarch64::IrqFrame` (x0, x1, pc, pstate, intid, sp) under which the stub's
//!   trampoline saved x2-x30, FPCR/FPSR and q0-q31; the trampoline returns with `svc #0`, which
//!   reloads pc, pstate (NZCV), sp, x0 and x1 from the frame. There is no EOI window and no
//!   owed EOI.
//! * Every vCPU's upcall SPI is reported as `UPCALL_IRQ`; SGIs are sent with `svc #1`; the
//!   virtual timer (`TIMER_IRQ`) is armed from EL0 and masked by the stub when it fires.
//! * `halt` is `wfi` at EL0 (no VMM exit); the per-vCPU block is reached through TPIDRRO_EL0
//!   (two-instruction reads, exclusive-pair writes, restartable sequences); TPIDR_EL0 is the
//!   thread's own (saved in switch frames and in a `UserContext`).
//! * CPU exceptions at EL0 are still fatal (the stub records the handler but delivers nothing).

pub mod context;
pub mod cpu;
pub mod entry;
pub mod fault;
pub mod rseq;

pub use activm_stub::protocol::arch::aarch64::{
    UserContext, RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ,
};
