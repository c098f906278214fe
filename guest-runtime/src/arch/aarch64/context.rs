//! TODO(aarch64): `switch_out`/`switch_in` saving x19-x30, sp, FPCR and d8-d15 (callee-saved);
//! new-thread frames; the trap-frame layout of the stub's EL0 trampoline (x0-x30, q0-q31, FPCR,
//! FPSR, ELR, SPSR) to resume a `protocol::arch::aarch64::UserContext`.
