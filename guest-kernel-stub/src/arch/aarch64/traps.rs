//! The EL1 exception vectors (VBAR_EL1, set by the VMM from `BootHeader::vectors`).
//!
//! * IRQ from EL0: acknowledge (ICC_IAR1_EL1) and EOI (ICC_EOIR1_EL1) at once, push an
//!   [`IrqFrame`] (x0, x1, PC, PSTATE, INTID, SP) on the interrupted EL0 stack and `eret` to the
//!   EL0 trampoline with interrupts on: 20 EL1 instructions. The trampoline saves the rest
//!   (x2-x30, q0-q31, FPCR, FPSR), runs the Rust handler, restores, and returns with `svc #0`.
//! * `svc #0` from EL0: the return path. Reloads PC, PSTATE (NZCV only: always EL0 with
//!   interrupts on), SP and x0/x1 from the frame at SP_EL0 and `eret`s: 17 EL1 instructions.
//! * `svc #1` from EL0: sends the SGI x0 describes (ICC_SGI1R_EL1 is EL1-only): 11 instructions.
//! * The virtual timer (INTID 27) is masked (CNTV_CTL_EL0.IMASK) before its EOI: it is
//!   level-triggered and would fire again at once; the EL0 handler re-arms it.
//! * Any other synchronous exception from EL0 (an abort, an undefined instruction, another
//!   `svc`...) while this vCPU has an alternate exception stack armed ([`arm_exception_stack`])
//!   is delivered to EL0 on that stack in 33 EL1 instructions: the stub disarms the stack,
//!   writes x0, x1 and an [`ExceptionInfo`] (SP, PC, PSTATE, ESR_EL1, FAR_EL1) at its top and
//!   `eret`s to `__activm_user_exception`, which saves the rest and calls the handler installed
//!   with [`set_exception_handler`]. A handler that returns resumes the faulting instruction
//!   (through the `svc #0` path) with the exception now fatal, as on x86_64.
//! * Anything else (a synchronous exception from EL0 with no stack armed, any exception taken
//!   at EL1, FIQ, SError, AArch32) is fatal: the `fatal_trap` hypercall with x1 = the vector
//!   offset; the VMM reads ESR_EL1, ELR_EL1, FAR_EL1 and SPSR_EL1 itself.

use core::mem::{offset_of, size_of};

use core::sync::atomic::{AtomicPtr, Ordering};

use protocol::arch::aarch64::{HYPERCALL_BASE, INTID_UPCALL_BASE};
use protocol::hypercall::Hypercall;
use protocol::MAX_VCPUS;

use crate::cpu_local::EXC_STACK_OFFSET;

pub use protocol::arch::aarch64::IrqFrame;

/// Registers the EL0 trampoline saves around the Rust handler: x2-x30 (29, plus a pad word),
/// FPCR and FPSR, q0-q31.
const SAVE_GPRS: usize = 30 * 8;
const SAVE_FP_CTRL: usize = 16;
const SAVE_SIZE: usize = SAVE_GPRS + SAVE_FP_CTRL + 32 * 16;

const _: () = assert!(size_of::<IrqFrame>().is_multiple_of(16) && SAVE_SIZE.is_multiple_of(16));

macro_rules! fatal_vector {
    ($offset:literal) => {
        concat!(
            ".org ",
            $offset,
            "\n stp x0, x1, [sp, #-16]!\n mov x1, #",
            $offset,
            "\n b __activm_el1_fatal\n"
        )
    };
}

core::arch::global_asm!(
    ".pushsection .text.activm.vectors, \"ax\"",
    ".balign 2048",
    ".globl __activm_vectors",
    "__activm_vectors:",
    fatal_vector!("0x000"),
    fatal_vector!("0x080"),
    fatal_vector!("0x100"),
    fatal_vector!("0x180"),
    fatal_vector!("0x200"),
    fatal_vector!("0x280"),
    fatal_vector!("0x300"),
    fatal_vector!("0x380"),
    // Synchronous from EL0: `svc #0` returns from an interrupt, anything else is fatal.
    ".org 0x400",
    "    stp x0, x1, [sp, #-16]!",
    "    mrs x0, esr_el1",
    "    movz x1, #{esr_svc0_hi}, lsl #16",
    "    cmp x0, x1",
    "    b.eq 3f",
    "    add x1, x1, #1",
    "    cmp x0, x1",
    "    b.ne __activm_el0_exception",
    // `svc #1`: send the SGI described by x0 (ICC_SGI1R_EL1 format), return after the svc.
    "    ldp x0, x1, [sp], #16",
    "    msr icc_sgi1r_el1, x0",
    "    eret",
    "3:",
    "    add sp, sp, #16",
    "    mrs x0, sp_el0",
    "    ldr x1, [x0, {off_pc}]",
    "    msr elr_el1, x1",
    "    ldr x1, [x0, {off_pstate}]",
    "    and x1, x1, #0xf0000000",
    "    msr spsr_el1, x1",
    "    ldr x1, [x0, {off_sp}]",
    "    msr sp_el0, x1",
    "    ldp x0, x1, [x0]",
    "    eret",
    // IRQ from EL0.
    ".org 0x480",
    "    msr tpidr_el1, x1",
    "    mrs x1, sp_el0",
    "    sub x1, x1, {frame}",
    "    and x1, x1, #~15",
    "    str x0, [x1]",
    "    mrs x0, tpidr_el1",
    "    str x0, [x1, #8]",
    "    mrs x0, elr_el1",
    "    str x0, [x1, {off_pc}]",
    "    mrs x0, spsr_el1",
    "    str x0, [x1, {off_pstate}]",
    "    mrs x0, sp_el0",
    "    str x0, [x1, {off_sp}]",
    "    mrs x0, icc_iar1_el1",
    "    str x0, [x1, {off_intid}]",
    "    b __activm_el0_irq_tail",
    fatal_vector!("0x500"),
    fatal_vector!("0x580"),
    fatal_vector!("0x600"),
    fatal_vector!("0x680"),
    fatal_vector!("0x700"),
    fatal_vector!("0x780"),
    ".org 0x800",
    "__activm_el0_irq_tail:",
    // The virtual timer is level-triggered: mask it (ENABLE | IMASK) before the EOI, or it
    // fires again at once; the EL0 handler re-arms it.
    "    cmp x0, {intid_vtimer}",
    "    b.ne 4f",
    "    mov x0, #3",
    "    msr cntv_ctl_el0, x0",
    "    mov x0, {intid_vtimer}",
    "4:  cmp x0, {intid_special}",
    "    b.hs 1f",
    "    msr icc_eoir1_el1, x0",
    "1:  msr sp_el0, x1",
    "    mov x0, x1",
    "    adrp x1, __activm_irq_trampoline",
    "    add x1, x1, :lo12:__activm_irq_trampoline",
    "    msr elr_el1, x1",
    "    msr spsr_el1, xzr",
    "    eret",
    // A synchronous exception from EL0 other than `svc #0`/`svc #1`. x0 = ESR_EL1; x0, x1 of
    // the faulting code are on the EL1 stack. With this vCPU's alternate stack armed, disarm
    // it, write an ExceptionFrame's x0, x1, sp, pc, pstate, esr and far at its top and `eret`
    // to `__activm_user_exception` with SP_EL0 = x0 = the frame; otherwise fatal.
    "__activm_el0_exception:",
    "    mrs x1, tpidrro_el0",
    "    ldr x1, [x1, {exc_stack}]",
    "    cbz x1, 5f",
    "    stp x2, x3, [sp, #-16]!",
    "    mrs x2, tpidrro_el0",
    "    str xzr, [x2, {exc_stack}]",
    "    sub x1, x1, {exc_frame}",
    "    str x0, [x1, {exc_esr}]",
    "    mrs x0, far_el1",
    "    str x0, [x1, {exc_far}]",
    "    mrs x0, elr_el1",
    "    str x0, [x1, {exc_pc}]",
    "    mrs x0, spsr_el1",
    "    str x0, [x1, {exc_pstate}]",
    "    mrs x0, sp_el0",
    "    str x0, [x1, {exc_sp}]",
    "    ldp x2, x3, [sp, #16]",
    "    stp x2, x3, [x1]",
    "    ldp x2, x3, [sp], #32",
    "    msr sp_el0, x1",
    "    mov x0, x1",
    "    adrp x1, __activm_user_exception",
    "    add x1, x1, :lo12:__activm_user_exception",
    "    msr elr_el1, x1",
    "    msr spsr_el1, xzr",
    "    eret",
    "5:  mov x1, #0x400",
    "    b __activm_el1_fatal",
    // Fatal: x0, x1 of the trapped code are on the EL1 stack, x1 = vector offset.
    "__activm_el1_fatal:",
    "    movz x0, #{hc_hi}, lsl #16",
    "    ldr x0, [x0, {hc_fatal}]",
    "2:  wfi",
    "    b 2b",
    ".popsection",
    // EL0: x0 = sp = the IrqFrame.
    ".pushsection .text.activm.user, \"ax\"",
    "__activm_irq_trampoline:",
    "    sub sp, sp, {save}",
    "    stp x2, x3, [sp, #0]",
    "    stp x4, x5, [sp, #16]",
    "    stp x6, x7, [sp, #32]",
    "    stp x8, x9, [sp, #48]",
    "    stp x10, x11, [sp, #64]",
    "    stp x12, x13, [sp, #80]",
    "    stp x14, x15, [sp, #96]",
    "    stp x16, x17, [sp, #112]",
    "    stp x18, x19, [sp, #128]",
    "    stp x20, x21, [sp, #144]",
    "    stp x22, x23, [sp, #160]",
    "    stp x24, x25, [sp, #176]",
    "    stp x26, x27, [sp, #192]",
    "    stp x28, x29, [sp, #208]",
    "    str x30, [sp, #224]",
    "    mrs x9, fpcr",
    "    mrs x10, fpsr",
    "    stp x9, x10, [sp, #240]",
    "    add x9, sp, #256",
    "    stp q0, q1, [x9, #0]",
    "    stp q2, q3, [x9, #32]",
    "    stp q4, q5, [x9, #64]",
    "    stp q6, q7, [x9, #96]",
    "    stp q8, q9, [x9, #128]",
    "    stp q10, q11, [x9, #160]",
    "    stp q12, q13, [x9, #192]",
    "    stp q14, q15, [x9, #224]",
    "    stp q16, q17, [x9, #256]",
    "    stp q18, q19, [x9, #288]",
    "    stp q20, q21, [x9, #320]",
    "    stp q22, q23, [x9, #352]",
    "    stp q24, q25, [x9, #384]",
    "    stp q26, q27, [x9, #416]",
    "    stp q28, q29, [x9, #448]",
    "    stp q30, q31, [x9, #480]",
    "    mov x29, #0",
    "    bl {irq_entry}",
    "    add x9, sp, #256",
    "    ldp q0, q1, [x9, #0]",
    "    ldp q2, q3, [x9, #32]",
    "    ldp q4, q5, [x9, #64]",
    "    ldp q6, q7, [x9, #96]",
    "    ldp q8, q9, [x9, #128]",
    "    ldp q10, q11, [x9, #160]",
    "    ldp q12, q13, [x9, #192]",
    "    ldp q14, q15, [x9, #224]",
    "    ldp q16, q17, [x9, #256]",
    "    ldp q18, q19, [x9, #288]",
    "    ldp q20, q21, [x9, #320]",
    "    ldp q22, q23, [x9, #352]",
    "    ldp q24, q25, [x9, #384]",
    "    ldp q26, q27, [x9, #416]",
    "    ldp q28, q29, [x9, #448]",
    "    ldp q30, q31, [x9, #480]",
    "    ldp x9, x10, [sp, #240]",
    "    msr fpcr, x9",
    "    msr fpsr, x10",
    "    ldp x2, x3, [sp, #0]",
    "    ldp x4, x5, [sp, #16]",
    "    ldp x6, x7, [sp, #32]",
    "    ldp x8, x9, [sp, #48]",
    "    ldp x10, x11, [sp, #64]",
    "    ldp x12, x13, [sp, #80]",
    "    ldp x14, x15, [sp, #96]",
    "    ldp x16, x17, [sp, #112]",
    "    ldp x18, x19, [sp, #128]",
    "    ldp x20, x21, [sp, #144]",
    "    ldp x22, x23, [sp, #160]",
    "    ldp x24, x25, [sp, #176]",
    "    ldp x26, x27, [sp, #192]",
    "    ldp x28, x29, [sp, #208]",
    "    ldr x30, [sp, #224]",
    "    add sp, sp, {save}",
    "    svc #0",
    "",
    // EL0, on the alternate stack: x0 = sp = the ExceptionFrame (x0, x1, sp, pc, pstate, esr
    // and far written at EL1), x2-x30 the faulting code's. Save them and the FP/SIMD state,
    // run the handler; if it returns, resume the faulting instruction through the `svc #0`
    // return path (an IrqFrame built below the ExceptionFrame), with exceptions now fatal.
    ".globl __activm_user_exception",
    ".type __activm_user_exception, @function",
    "__activm_user_exception:",
    "    stp x2, x3, [sp, #16]",
    "    stp x4, x5, [sp, #32]",
    "    stp x6, x7, [sp, #48]",
    "    stp x8, x9, [sp, #64]",
    "    stp x10, x11, [sp, #80]",
    "    stp x12, x13, [sp, #96]",
    "    stp x14, x15, [sp, #112]",
    "    stp x16, x17, [sp, #128]",
    "    stp x18, x19, [sp, #144]",
    "    stp x20, x21, [sp, #160]",
    "    stp x22, x23, [sp, #176]",
    "    stp x24, x25, [sp, #192]",
    "    stp x26, x27, [sp, #208]",
    "    stp x28, x29, [sp, #224]",
    "    str x30, [sp, #240]",
    "    sub sp, sp, {fp_save}",
    "    mrs x9, fpcr",
    "    mrs x10, fpsr",
    "    stp x9, x10, [sp, #0]",
    "    add x9, sp, #16",
    "    stp q0, q1, [x9, #0]",
    "    stp q2, q3, [x9, #32]",
    "    stp q4, q5, [x9, #64]",
    "    stp q6, q7, [x9, #96]",
    "    stp q8, q9, [x9, #128]",
    "    stp q10, q11, [x9, #160]",
    "    stp q12, q13, [x9, #192]",
    "    stp q14, q15, [x9, #224]",
    "    stp q16, q17, [x9, #256]",
    "    stp q18, q19, [x9, #288]",
    "    stp q20, q21, [x9, #320]",
    "    stp q22, q23, [x9, #352]",
    "    stp q24, q25, [x9, #384]",
    "    stp q26, q27, [x9, #416]",
    "    stp q28, q29, [x9, #448]",
    "    stp q30, q31, [x9, #480]",
    "    mov x29, #0",
    "    bl {exception_dispatch}",
    "    add x9, sp, #16",
    "    ldp q0, q1, [x9, #0]",
    "    ldp q2, q3, [x9, #32]",
    "    ldp q4, q5, [x9, #64]",
    "    ldp q6, q7, [x9, #96]",
    "    ldp q8, q9, [x9, #128]",
    "    ldp q10, q11, [x9, #160]",
    "    ldp q12, q13, [x9, #192]",
    "    ldp q14, q15, [x9, #224]",
    "    ldp q16, q17, [x9, #256]",
    "    ldp q18, q19, [x9, #288]",
    "    ldp q20, q21, [x9, #320]",
    "    ldp q22, q23, [x9, #352]",
    "    ldp q24, q25, [x9, #384]",
    "    ldp q26, q27, [x9, #416]",
    "    ldp q28, q29, [x9, #448]",
    "    ldp q30, q31, [x9, #480]",
    "    ldp x9, x10, [sp, #0]",
    "    msr fpcr, x9",
    "    msr fpsr, x10",
    // sp = the IrqFrame, then the ExceptionFrame at sp + {irq}: an interrupt from here on
    // pushes below both.
    "    add sp, sp, {fp_save} - {irq}",
    "    ldp x9, x10, [sp, #{irq}]",
    "    stp x9, x10, [sp]",
    "    ldr x9, [sp, #{irq} + {exc_pc}]",
    "    str x9, [sp, {off_pc}]",
    "    ldr x9, [sp, #{irq} + {exc_pstate}]",
    "    str x9, [sp, {off_pstate}]",
    "    ldr x9, [sp, #{irq} + {exc_sp}]",
    "    str x9, [sp, {off_sp}]",
    "    ldp x2, x3, [sp, #{irq} + 16]",
    "    ldp x4, x5, [sp, #{irq} + 32]",
    "    ldp x6, x7, [sp, #{irq} + 48]",
    "    ldp x8, x9, [sp, #{irq} + 64]",
    "    ldp x10, x11, [sp, #{irq} + 80]",
    "    ldp x12, x13, [sp, #{irq} + 96]",
    "    ldp x14, x15, [sp, #{irq} + 112]",
    "    ldp x16, x17, [sp, #{irq} + 128]",
    "    ldp x18, x19, [sp, #{irq} + 144]",
    "    ldp x20, x21, [sp, #{irq} + 160]",
    "    ldp x22, x23, [sp, #{irq} + 176]",
    "    ldp x24, x25, [sp, #{irq} + 192]",
    "    ldp x26, x27, [sp, #{irq} + 208]",
    "    ldp x28, x29, [sp, #{irq} + 224]",
    "    ldr x30, [sp, #{irq} + 240]",
    "    svc #0",
    ".size __activm_user_exception, . - __activm_user_exception",
    ".popsection",
    esr_svc0_hi = const (0x15u64 << 26 | 1 << 25) >> 16,
    off_pc = const offset_of!(IrqFrame, pc),
    off_pstate = const offset_of!(IrqFrame, pstate),
    off_intid = const offset_of!(IrqFrame, intid),
    off_sp = const offset_of!(IrqFrame, sp),
    frame = const size_of::<IrqFrame>(),
    intid_special = const protocol::arch::aarch64::INTID_SPECIAL,
    intid_vtimer = const protocol::arch::aarch64::TIMER_IRQ,
    hc_hi = const HYPERCALL_BASE >> 16,
    hc_fatal = const Hypercall::FatalTrap as u64 * 8,
    save = const SAVE_SIZE,
    irq_entry = sym irq_entry,
    exception_dispatch = sym exception_dispatch,
    exc_stack = const EXC_STACK_OFFSET,
    exc_frame = const size_of::<ExceptionFrame>(),
    exc_esr = const offset_of!(ExceptionFrame, esr),
    exc_far = const offset_of!(ExceptionFrame, far),
    exc_pc = const offset_of!(ExceptionFrame, pc),
    exc_pstate = const offset_of!(ExceptionFrame, pstate),
    exc_sp = const offset_of!(ExceptionFrame, sp),
    fp_save = const FP_SAVE,
    irq = const size_of::<IrqFrame>(),
);

const _: () = assert!(HYPERCALL_BASE & 0xffff == 0 && HYPERCALL_BASE >> 32 == 0);

/// The Rust side of interrupt delivery, at EL0 with interrupts on. Every vCPU's upcall SPI
/// (`INTID_UPCALL_BASE + vcpu`) runs the handler of `INTID_UPCALL_BASE`, so one registration
/// serves every vCPU, as x86's single upcall vector does.
extern "C" fn irq_entry(frame: &mut IrqFrame) {
    let intid = frame.intid as u32;
    let vector = if (INTID_UPCALL_BASE..INTID_UPCALL_BASE + MAX_VCPUS as u32).contains(&intid) {
        INTID_UPCALL_BASE
    } else {
        intid
    };
    if let Ok(vector) = u8::try_from(vector) {
        crate::irq::run_handler(vector, frame);
    }
}

/// What `__activm_user_exception` hands the exception handler: the faulting code's registers
/// (x0, x1, sp, pc, pstate, esr and far written at EL1, x2-x30 saved at EL0). The FP/SIMD state
/// lies below it.
#[repr(C)]
#[derive(Clone, Debug, Default)]
pub struct ExceptionFrame {
    pub x: [u64; 31],
    pub sp: u64,
    pub pc: u64,
    pub pstate: u64,
    /// ESR_EL1 and FAR_EL1, read at EL1.
    pub esr: u64,
    pub far: u64,
}

/// The part of [`ExceptionFrame`] after the general registers, which the EL1 stub writes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExceptionInfo {
    pub sp: u64,
    pub pc: u64,
    pub pstate: u64,
    pub esr: u64,
    pub far: u64,
}

/// FPCR, FPSR and q0-q31, saved below the [`ExceptionFrame`].
const FP_SAVE: usize = 16 + 32 * 16;

const _: () = {
    assert!(offset_of!(ExceptionFrame, sp) == 31 * 8);
    assert!(size_of::<ExceptionFrame>() == 31 * 8 + size_of::<ExceptionInfo>());
    assert!(size_of::<ExceptionFrame>().is_multiple_of(16) && FP_SAVE.is_multiple_of(16));
};

/// A CPU-exception handler. It runs at EL0 on the vCPU's alternate stack with further
/// exceptions fatal; returning re-executes the faulting instruction, which then ends the guest
/// with the VMM's fault report.
pub type ExceptionHandler = fn(&mut ExceptionFrame);

static EXCEPTION_HANDLER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Installs the handler for CPU exceptions raised at EL0 (on vCPUs with an armed stack).
pub fn set_exception_handler(handler: ExceptionHandler) {
    EXCEPTION_HANDLER.store(handler as *mut (), Ordering::Release);
}

/// Arms this vCPU's alternate exception stack: the next synchronous exception at EL0 (other
/// than the stub's own `svc`s) is delivered to the handler on the stack below `top` (16-byte
/// aligned, at least a few KiB, never used for anything else). Delivery disarms it.
pub fn arm_exception_stack(top: u64) {
    debug_assert!(top.is_multiple_of(16));
    // SAFETY: the alternate-stack word is a writable 8-byte field of the block.
    unsafe { super::percpu::local_write(EXC_STACK_OFFSET, top) };
}

/// Called by `__activm_user_exception` at EL0 on the alternate stack.
extern "C" fn exception_dispatch(frame: &mut ExceptionFrame) {
    let raw = EXCEPTION_HANDLER.load(Ordering::Acquire);
    if !raw.is_null() {
        // SAFETY: only `set_exception_handler` stores non-null values, all `ExceptionHandler`s.
        let handler = unsafe { core::mem::transmute::<*mut (), ExceptionHandler>(raw) };
        handler(frame);
    }
}

/// The EOI is sent at EL1 before the EL0 trampoline runs: there is no window in which an
/// interrupted context still owes it.
pub fn trap_eoi_window() -> (u64, u64) {
    (0, 0)
}

/// Which INTIDs (below 256, the handler table's size) may have a handler: SGIs, PPIs and SPIs.
pub(crate) fn may_have_handler(_vector: u8) -> bool {
    true
}
