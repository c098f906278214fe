//! CPU exceptions (x86_64): what the runtime's exception handler reads from the stub's frame.

use activm_stub::ExceptionFrame;

/// #PF.
const PAGE_FAULT: u64 = 14;
/// #UD.
const INVALID_OPCODE: u64 = 6;

/// The exception's number (for messages).
pub fn number(frame: &ExceptionFrame) -> u64 {
    frame.vector
}

/// The address a page fault was about, if the exception is one.
pub fn page_fault_address(frame: &ExceptionFrame) -> Option<u64> {
    (frame.vector == PAGE_FAULT).then_some(frame.cr2)
}

/// The faulting instruction's address.
pub fn pc(frame: &ExceptionFrame) -> u64 {
    frame.rip
}

/// The stack pointer at the fault.
pub fn sp(frame: &ExceptionFrame) -> u64 {
    frame.rsp
}

/// The faulting-address register (diagnostics: meaningful for page faults only).
pub fn fault_address(frame: &ExceptionFrame) -> u64 {
    frame.cr2
}

/// If the exception is an invalid-opcode fault on an instruction that loads FP/SSE control
/// state, that instruction's address. `readable` says whether an address may be read (the
/// runtime's guard pages are not). Such a fault is spurious on our hosts (see `crate::fault`).
pub fn fp_control_fault(frame: &ExceptionFrame, readable: impl Fn(u64) -> bool) -> Option<u64> {
    let pc = frame.rip;
    if frame.vector != INVALID_OPCODE || !readable(pc) {
        return None;
    }
    // SAFETY: the faulting instruction's first bytes, in this guest's mapped image (the caller
    // checked the address).
    let b = unsafe { core::ptr::read_volatile(pc as *const [u8; 4]) };
    fp_control_load(b).then_some(pc)
}

/// Whether an instruction starting with `b` loads FP/SSE control state (valid at CPL3, where
/// CR4.OSFXSR is set from boot and never changed): after an optional REX
/// prefix, 0F AE /1 (`fxrstor`), 0F AE /2 (`ldmxcsr`) or D9 /5 (`fldcw`), with a memory operand.
pub fn fp_control_load(b: [u8; 4]) -> bool {
    let i = usize::from(b[0] & 0xf0 == 0x40);
    let mem_reg = |modrm: u8| (modrm >> 6 != 3, (modrm >> 3) & 7);
    match (b[i], b[i + 1]) {
        (0x0f, 0xae) => matches!(mem_reg(b[i + 2]), (true, 1 | 2)),
        (0xd9, modrm) => mem_reg(modrm) == (true, 5),
        _ => false,
    }
}
