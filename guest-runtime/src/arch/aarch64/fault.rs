//! CPU exceptions (aarch64): what the runtime's exception handler reads from the stub's frame
//! (ESR_EL1 and FAR_EL1 read at EL1).

use activm_stub::protocol::arch::aarch64::UserContext;
use activm_stub::ExceptionFrame;

/// ESR_EL1 exception class of a data abort from a lower exception level.
const EC_DATA_ABORT_LOWER: u64 = 0x24;

/// The exception's class (ESR_EL1.EC, for messages).
pub fn number(frame: &ExceptionFrame) -> u64 {
    frame.esr >> 26
}

/// The address a data abort was about, if the exception is one.
pub fn page_fault_address(frame: &ExceptionFrame) -> Option<u64> {
    (number(frame) == EC_DATA_ABORT_LOWER).then_some(frame.far)
}

/// The faulting instruction's address.
pub fn pc(frame: &ExceptionFrame) -> u64 {
    frame.pc
}

/// The stack pointer at the fault.
pub fn sp(frame: &ExceptionFrame) -> u64 {
    frame.sp
}

/// Whether a general register held `v` at the fault.
pub fn any_register(frame: &ExceptionFrame, v: u64) -> bool {
    frame.x.contains(&v)
}

/// The faulting-address register (diagnostics: meaningful for aborts only).
pub fn fault_address(frame: &ExceptionFrame) -> u64 {
    frame.far
}

/// x86_64 explains `#UD`s of FP control loads (bad MXCSR values); aarch64 has none.
pub fn fp_control_fault(_frame: &ExceptionFrame, _readable: impl Fn(u64) -> bool) -> Option<u64> {
    None
}

/// No aarch64 instruction is treated as an FP-control load.
pub fn fp_control_load(_b: [u8; 4]) -> bool {
    false
}

/// The faulting code's context for a context taken in the CPU-exception handler: not built on
/// aarch64 yet (such a context is resumed as it was taken; docs/security.md, "Known limits").
pub fn faulting_context(_ctx: &UserContext, _top: u64) -> Option<UserContext> {
    None
}

/// Nothing to mark on aarch64 (see [`faulting_context`]).
pub fn mark_handler_holds(_frame: &mut ExceptionFrame) {}

/// No FP-control faults on aarch64 (see [`fp_control_fault`]).
pub fn fp_control_mxcsr(_frame: &ExceptionFrame, _readable: impl Fn(u64) -> bool) -> Option<u32> {
    None
}
