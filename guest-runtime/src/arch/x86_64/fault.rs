//! CPU exceptions (x86_64): what the runtime's exception handler reads from the stub's frame.

use activm_stub::arch::x86_64::{exception_stack_layout, user_exception_window, EXCEPTION_SAVED};
use activm_stub::protocol::arch::x86_64::{FxsaveArea, Gprs, UserContext};
use activm_stub::ExceptionFrame;

use super::context::gprs_of;

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

/// Whether a general register held `v` at the fault.
pub fn any_register(frame: &ExceptionFrame, v: u64) -> bool {
    [
        frame.rax, frame.rcx, frame.rdx, frame.rbx, frame.rbp, frame.rsi, frame.rdi, frame.r8,
        frame.r9, frame.r10, frame.r11, frame.r12, frame.r13, frame.r14, frame.r15,
    ]
    .contains(&v)
}

/// The faulting-address register (diagnostics: meaningful for page faults only).
pub fn fault_address(frame: &ExceptionFrame) -> u64 {
    frame.cr2
}

/// If the exception is an invalid-opcode fault on an instruction that loads FP/SSE control
/// state, that instruction's address. `readable` says whether an address may be read (the
/// runtime's guard pages are not). On our hosts such a fault means the loaded MXCSR value had
/// reserved bits (see `crate::fault`).
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

/// The MXCSR value the faulting `ldmxcsr` or `fxrstor` tried to load, where its operand is a
/// base register plus displacement (the forms the runtime and stub use) at a `readable` address.
pub fn fp_control_mxcsr(frame: &ExceptionFrame, readable: impl Fn(u64) -> bool) -> Option<u32> {
    let pc = frame.rip;
    if !readable(pc) {
        return None;
    }
    // SAFETY: the faulting instruction's bytes, in this guest's mapped image (checked above).
    let b = unsafe { core::ptr::read_volatile(pc as *const [u8; 8]) };
    let rex = if b[0] & 0xf0 == 0x40 { b[0] } else { 0 };
    let i = usize::from(rex != 0);
    // MXCSR lies at the operand (`ldmxcsr`, 0F AE /2) or 24 bytes into it (`fxrstor`, /1).
    if (b[i], b[i + 1]) != (0x0f, 0xae) {
        return None;
    }
    let modrm = b[i + 2];
    let (mode, reg, rm) = (modrm >> 6, (modrm >> 3) & 7, modrm & 7);
    let offset = match reg {
        2 => 0,
        1 => 24,
        _ => return None,
    };
    let (base, disp_at) = match rm {
        4 => {
            let sib = b[i + 3];
            // No index register, and a base register (not disp32 alone).
            if (sib >> 3) & 7 != 4 || rex & 2 != 0 || (sib & 7 == 5 && mode == 0) {
                return None;
            }
            (sib & 7, i + 4)
        }
        5 if mode == 0 => return None,
        rm => (rm, i + 3),
    };
    let disp = match mode {
        0 => 0,
        1 => i64::from(b[disp_at] as i8),
        2 => i64::from(i32::from_le_bytes(b[disp_at..disp_at + 4].try_into().ok()?)),
        _ => return None,
    };
    let base = [
        frame.rax, frame.rcx, frame.rdx, frame.rbx, frame.rsp, frame.rbp, frame.rsi, frame.rdi,
        frame.r8, frame.r9, frame.r10, frame.r11, frame.r12, frame.r13, frame.r14, frame.r15,
    ][usize::from(base | ((rex & 1) << 3))];
    let at = base.wrapping_add(disp as u64).wrapping_add(offset);
    if !readable(at) || !readable(at + 3) {
        return None;
    }
    // SAFETY: a readable guest address (checked above).
    Some(unsafe { core::ptr::read_volatile(at as *const u32) })
}

/// The faulting code's context, for a context `ctx` the VMM took while the CPU-exception
/// handler ran on the alternate stack whose top is `top`: the GPRs, instruction and stack
/// pointers and flags at the fault, and its FP/SSE state, from the handler's frame there (or
/// from `ctx` where the entry had not saved them yet). Resumed, it runs the faulting instruction
/// again, as the handler's return would. `None` where `ctx` must be continued as it is: the
/// handler holds locks or preemption holds only it gives back ([`mark_handler_holds`]), or an
/// interrupt nested in the entry before it saved the frame (the faulting GPRs are then in that
/// interrupt's frame).
pub fn faulting_context(ctx: &UserContext, top: u64) -> Option<UserContext> {
    let at = exception_stack_layout(top);
    let window = user_exception_window();
    let pc = ctx.rip;
    // SAFETY: `top` is an exception stack's top (the runtime's own allocation); the mark, the
    // frame and the image lie inside that stack, under its top.
    let mark = unsafe { (at.saved_mark as *const u64).read_volatile() };
    let in_entry = (window.start..window.saved).contains(&pc);
    let returned = (window.returned..window.end).contains(&pc);
    let rewind = in_entry || returned || mark == EXCEPTION_SAVED;
    if !rewind {
        return None;
    }
    // SAFETY: as above; the CPL0 stub wrote the frame's exception part before entering CPL3,
    // and `__activm_user_exception` its GPRs by `pushed`.
    let frame = unsafe { (at.frame as *const ExceptionFrame).read_volatile() };
    let mut out = *ctx;
    if pc >= window.pushed || !in_entry {
        out.gprs = gprs_of!(frame, 0);
    }
    if !in_entry {
        // SAFETY: as above; the image is complete once the entry passed `saved`.
        out.fxsave = unsafe { (at.fxsave as *const FxsaveArea).read_volatile() };
    }
    out.gprs.rsp = frame.rsp;
    out.rip = frame.rip;
    out.rflags = frame.rflags;
    Some(out)
}

/// Called by the handler before it takes what it will not give back (see [`faulting_context`]).
pub fn mark_handler_holds(frame: &mut ExceptionFrame) {
    activm_stub::arch::x86_64::mark_handler_holds(frame)
}
