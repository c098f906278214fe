//! TODO(aarch64): the VBAR_EL1 vector table. Synchronous exceptions from EL0/EL1 and anything
//! from EL1 are fatal (`fatal_trap`); IRQs from EL0 are delivered to an EL0 trampoline
//! signal-style (save x0-x30, q0-q31, FPCR, FPSR), like `arch::x86_64::traps`.
