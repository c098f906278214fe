//! Thread contexts: voluntary switches, new threads, and full contexts (interrupted threads,
//! contexts handed over in upcall records).
//!
//! **Voluntary switch** (a plain call at CPL3, no interrupt, no exit): [`switch_out`] pushes the
//! callee-saved registers, MXCSR and the x87 control word on the thread's stack, marks this vCPU
//! as in the scheduler (`Word::InSched`), stores the stack pointer in the thread's TCB (offset 0)
//! and calls the scheduler entry on this activation's stack (`Word::SchedTop`), which never
//! returns. [`switch_in`] makes a thread current and pops that frame. The order of the stores is
//! what makes interrupts safe:
//!
//! * before `InSched = 1` the code is the thread's own and may be preempted like any other (a
//!   nested switch-out just saves a deeper stack pointer, overwritten by the outer one later);
//! * from `InSched = 1` to the end of `switch_in`'s commit (`InSched = 0`) handlers only defer;
//! * `switch_in` is a restartable sequence (`rseq`): a context taken in it (by the VMM) is
//!   rewound to its start and repeated wherever it is resumed, with `rdi` = the thread.
//!
//! After its commit `switch_in` checks the stub's pending word and calls the runtime's safepoint
//! if an interrupt deferred work meanwhile.
//!
//! **Full contexts.** An interrupted thread's state is the stub's trap frame ([`IrqFrame`]: the
//! GPRs, vector, error code, rflags, rip) on its own stack, with the FXSAVE image 16-byte aligned
//! below it; a timer preemption simply switches away from inside the handler and returns through
//! the same epilogue when resumed, on any vCPU. A [`UserContext`] from an upcall record is
//! resumed the same way: [`build_resume_frame`] writes that trap-frame layout below the context's
//! stack pointer plus a switch frame whose return address is `__rt_resume_frame`, the epilogue.

// The assembly calls the runtime by symbol (`extern "C"`, defined above this layer):
// `__rt_sched_entry(prev, action, arg)`, `__rt_thread_main(tcb)`, `__rt_safepoint()`,
// `__rt_release_left_stack(top)`.

use core::mem::{offset_of, size_of};

use activm_stub::arch::x86_64::percpu::PENDING_OFFSET;
use activm_stub::protocol::arch::x86_64::{FxsaveArea, Gprs, UserContext};
use activm_stub::IrqFrame;

use super::cpu::{offset, Word};

/// MXCSR at thread start: all exceptions masked, round to nearest.
pub const MXCSR_DEFAULT: u32 = 0x1F80;
/// x87 control word at thread start.
pub const FCW_DEFAULT: u16 = 0x037F;
/// RFLAGS bits a resumed context may carry (arithmetic flags and DF); IF is always on.
const RFLAGS_USER_MASK: u64 = 0xCD5 | 0x400;
const RFLAGS_BASE: u64 = 0x202;

/// The frame [`switch_out`] leaves at the saved stack pointer (16-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwitchFrame {
    pub mxcsr: u32,
    pub fcw: u32,
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbx: u64,
    pub rbp: u64,
    pub ret: u64,
}

const _: () = assert!(size_of::<SwitchFrame>() == 64);
const _: () = assert!(size_of::<IrqFrame>() == 152);

core::arch::global_asm!(
    ".pushsection .text.activm_rt.switch, \"ax\"",
    // fn __rt_switch_out(t: *mut Tcb, action: usize, arg: usize): returns when t is resumed.
    ".globl __rt_switch_out",
    ".type __rt_switch_out, @function",
    "__rt_switch_out:",
    "    pushq %rbp",
    "    pushq %rbx",
    "    pushq %r12",
    "    pushq %r13",
    "    pushq %r14",
    "    pushq %r15",
    "    sub $8, %rsp",
    "    stmxcsr (%rsp)",
    "    fnstcw 4(%rsp)",
    "    movq $1, %gs:{in_sched}",
    "    mov %rsp, (%rdi)",
    "    mov %gs:{sched_top}, %rsp",
    "    xor %ebp, %ebp",
    "    call __rt_sched_entry",
    "    ud2",
    ".size __rt_switch_out, . - __rt_switch_out",
    "",
    // The new-thread trampoline: switch_in returns here with r12 = the TCB.
    ".globl __rt_thread_start",
    "__rt_thread_start:",
    "    mov %r12, %rdi",
    "    xor %ebp, %ebp",
    "    call __rt_thread_main",
    "    ud2",
    "",
    // The epilogue of a trap frame at rbx (IrqFrame layout, FXSAVE image below): like the stub's
    // __activm_user_trap after its handler returns.
    ".globl __rt_resume_frame",
    "__rt_resume_frame:",
    "    lea -512(%rbx), %rax",
    "    and $-16, %rax",
    "    fxrstor64 (%rax)",
    "    mov %rbx, %rsp",
    "    popq %r15",
    "    popq %r14",
    "    popq %r13",
    "    popq %r12",
    "    popq %r11",
    "    popq %r10",
    "    popq %r9",
    "    popq %r8",
    "    popq %rbp",
    "    popq %rdi",
    "    popq %rsi",
    "    popq %rdx",
    "    popq %rcx",
    "    popq %rbx",
    "    popq %rax",
    "    add $16, %rsp",
    "    popfq",
    "    ret",
    ".popsection",
    "",
    // fn __rt_switch_in(t: *const Tcb) -> !: a restartable sequence up to its commit.
    ".pushsection .text.activm_rt.rseq, \"ax\"",
    ".globl __rt_switch_in",
    ".type __rt_switch_in, @function",
    "__rt_switch_in:",
    ".globl __rt_rseq_switch_in_start",
    "__rt_rseq_switch_in_start:",
    "    mov %rdi, %gs:{current}",
    "    mov (%rdi), %rsp",
    "    movq $0, %gs:{in_sched}",
    ".globl __rt_rseq_switch_in_end",
    "__rt_rseq_switch_in_end:",
    "    cmpq $0, %gs:{pending}",
    "    jne 2f",
    "1:",
    "    ldmxcsr (%rsp)",
    "    fldcw 4(%rsp)",
    "    add $8, %rsp",
    "    popq %r15",
    "    popq %r14",
    "    popq %r13",
    "    popq %r12",
    "    popq %rbx",
    "    popq %rbp",
    "    ret",
    "2:",
    "    call __rt_safepoint",
    "    jmp 1b",
    ".size __rt_switch_in, . - __rt_switch_in",
    ".popsection",
    "",
    ".pushsection .text.activm_rt.switch, \"ax\"",
    // fn __rt_suspend_scheduler(new_top: u64, f: extern fn(sp, old_top) -> !): from the
    // scheduler (InSched = 1): leave a switch frame here, move this vCPU's scheduler to the
    // stack at new_top and call f(frame sp, old stack top) there. Returns (0) when the frame is
    // adopted again (`__rt_resume_switch_frame`).
    ".globl __rt_suspend_scheduler",
    "__rt_suspend_scheduler:",
    "    pushq %rbp",
    "    pushq %rbx",
    "    pushq %r12",
    "    pushq %r13",
    "    pushq %r14",
    "    pushq %r15",
    "    sub $8, %rsp",
    "    stmxcsr (%rsp)",
    "    fnstcw 4(%rsp)",
    "    mov %rsi, %rax",
    "    mov %gs:{sched_top}, %rsi",
    "    mov %rdi, %gs:{sched_top}",
    "    mov %rsp, %rdx",
    "    mov %rdi, %rsp",
    "    mov %rdx, %rdi",
    "    xor %ebp, %ebp",
    "    call *%rax",
    "    ud2",
    ".globl __rt_resume_switch_frame",
    "__rt_resume_switch_frame:",
    "    mov %rdi, %rsp",
    "    mov %rdi, %rbx",
    "    and $-16, %rsp",
    "    mov %rsi, %rdi",
    "    call __rt_release_left_stack",
    "    mov %rbx, %rsp",
    "    xor %eax, %eax",
    "    ldmxcsr (%rsp)",
    "    fldcw 4(%rsp)",
    "    add $8, %rsp",
    "    popq %r15",
    "    popq %r14",
    "    popq %r13",
    "    popq %r12",
    "    popq %rbx",
    "    popq %rbp",
    "    ret",
    ".popsection",
    in_sched = const offset(Word::InSched),
    sched_top = const offset(Word::SchedTop),
    current = const offset(Word::Current),
    pending = const PENDING_OFFSET,
    options(att_syntax),
);

extern "C" {
    fn __rt_thread_start();
    fn __rt_resume_frame();
}

pub use crate::arch::switch::{resume_switch_frame, suspend_scheduler, switch_in, switch_out};

/// Writes the first frame of a new thread below `stack_top` (16-byte aligned) so that
/// [`switch_in`] starts it in `thread_main(tcb)`; returns the stack pointer to save.
///
/// # Safety
/// `[stack_top - 64, stack_top)` is writable memory of the thread's unused stack.
pub unsafe fn build_start_frame(stack_top: usize, tcb: *const u8) -> usize {
    let sp = stack_top - size_of::<SwitchFrame>();
    let frame = SwitchFrame {
        mxcsr: MXCSR_DEFAULT,
        fcw: u32::from(FCW_DEFAULT),
        r12: tcb as u64,
        ret: __rt_thread_start as *const () as u64,
        ..SwitchFrame::default()
    };
    // SAFETY: the caller guarantees the memory; sp is 16-byte aligned (stack_top is).
    unsafe { (sp as *mut SwitchFrame).write(frame) };
    sp
}

/// The trap frame and FXSAVE image a resumed context needs, below `rsp`: the frame's address.
pub const fn trap_frame_at(rsp: u64) -> u64 {
    rsp - size_of::<IrqFrame>() as u64
}

/// Writes `ctx` as a trap frame (and FXSAVE image) below `ctx.rsp`, plus a switch frame below
/// that which [`switch_in`] turns into a return through `__rt_resume_frame`; returns the stack
/// pointer to store in the thread's TCB. The context's `rip` must already be fixed up (restartable
/// sequences rewound).
///
/// # Safety
/// The 1 KiB below `ctx.rsp` is free stack memory nobody else uses (x86_64 guests have no red
/// zone), and `ctx` was taken from this guest at CPL3.
pub unsafe fn build_resume_frame(ctx: &UserContext) -> usize {
    let frame_at = trap_frame_at(ctx.gprs.rsp);
    let g: &Gprs = &ctx.gprs;
    let frame = IrqFrame {
        r15: g.r15,
        r14: g.r14,
        r13: g.r13,
        r12: g.r12,
        r11: g.r11,
        r10: g.r10,
        r9: g.r9,
        r8: g.r8,
        rbp: g.rbp,
        rdi: g.rdi,
        rsi: g.rsi,
        rdx: g.rdx,
        rcx: g.rcx,
        rbx: g.rbx,
        rax: g.rax,
        vector: 0,
        error_code: 0,
        rflags: (ctx.rflags & RFLAGS_USER_MASK) | RFLAGS_BASE,
        rip: ctx.rip,
    };
    let fx_at = (frame_at - 512) & !15;
    let sp = fx_at - size_of::<SwitchFrame>() as u64;
    let switch = SwitchFrame {
        mxcsr: MXCSR_DEFAULT,
        fcw: u32::from(FCW_DEFAULT),
        rbx: frame_at,
        ret: __rt_resume_frame as *const () as u64,
        ..SwitchFrame::default()
    };
    // SAFETY: the caller guarantees the memory below ctx.rsp; all three writes are aligned.
    unsafe {
        (frame_at as *mut IrqFrame).write(frame);
        (fx_at as *mut FxsaveArea).write(ctx.fxsave);
        (sp as *mut SwitchFrame).write(switch);
    }
    sp as usize
}

/// Continues the context whose resume frame [`build_resume_frame`] built at `sp`, without
/// making it a thread (the scheduler adopts a scheduler context handed over by the VMM).
///
/// Once on the frame's stack, gives back `release` (the stack the caller leaves; 0: none) with
/// `__rt_release_left_stack` (by name: `activation::stacks`).
///
/// # Safety
/// As for [`switch_in`], and `sp` came from [`build_resume_frame`]; nothing runs on `release`
/// after the switch.
pub unsafe fn jump_to_frame(sp: usize, release: u64) -> ! {
    // SAFETY: the caller guarantees a switch frame at sp whose rbx is a trap frame, and free
    // stack below it (the release call runs there); the epilogue restores everything from the
    // frame.
    unsafe {
        core::arch::asm!(
            "mov rsp, rdi",
            "mov rbx, rdi",
            "and rsp, -16",
            "mov rdi, rsi",
            "call __rt_release_left_stack",
            "mov rdi, rbx",
            "mov rbx, [rdi + {rbx}]",
            "jmp {resume}",
            in("rdi") sp,
            in("rsi") release,
            rbx = const offset_of!(SwitchFrame, rbx),
                    resume = sym __rt_resume_frame,
            options(noreturn),
        )
    }
}

/// The FXSAVE image the stub's trampoline saved below `frame`.
pub fn saved_fxsave(frame: &IrqFrame) -> &FxsaveArea {
    let at = (frame as *const IrqFrame as u64 - 512) & !15;
    // SAFETY: `__activm_user_trap` (and `__rt_resume_frame`'s builder) put the FXSAVE image
    // exactly there, on the same stack, live while the frame is.
    unsafe { &*(at as *const FxsaveArea) }
}

/// The general registers a stub frame (`IrqFrame` or `ExceptionFrame`: both save them under
/// the same names) holds, with `rsp` as the stack pointer.
macro_rules! gprs_of {
    ($frame:expr, $rsp:expr) => {
        Gprs {
            rax: $frame.rax,
            rbx: $frame.rbx,
            rcx: $frame.rcx,
            rdx: $frame.rdx,
            rsi: $frame.rsi,
            rdi: $frame.rdi,
            rbp: $frame.rbp,
            rsp: $rsp,
            r8: $frame.r8,
            r9: $frame.r9,
            r10: $frame.r10,
            r11: $frame.r11,
            r12: $frame.r12,
            r13: $frame.r13,
            r14: $frame.r14,
            r15: $frame.r15,
        }
    };
}
pub(super) use gprs_of;

/// The complete context of the code `frame` interrupted (what the VMM would hand over).
pub fn capture(frame: &IrqFrame) -> UserContext {
    UserContext {
        gprs: gprs_of!(frame, frame.rsp()),
        rip: frame.rip,
        rflags: frame.rflags,
        fs_base: 0,
        gs_base: 0,
        _reserved: [0; 4],
        fxsave: *saved_fxsave(frame),
    }
}

/// Leaves the current stack for good: this activation's scheduler stack, `f()` there.
///
/// # Safety
/// Nothing on the current stack is needed any more (its owner was handed over), and this vCPU
/// is marked as in the scheduler.
pub unsafe fn abandon_to_scheduler(f: extern "C" fn() -> !) -> ! {
    // SAFETY: the caller guarantees the current stack is given up; SchedTop is this activation's
    // scheduler stack, free while the scheduler is not running on it.
    unsafe {
        core::arch::asm!(
            "mov rsp, gs:[{top}]",
            "xor ebp, ebp",
            "call {f}",
            "ud2",
            top = const offset(Word::SchedTop),
            f = in(reg) f,
            options(noreturn),
        )
    }
}

/// Resets MXCSR and the x87 control word (a new activation starts with whatever the vCPU had).
pub fn reset_fp_control() {
    let mxcsr = MXCSR_DEFAULT;
    let fcw = FCW_DEFAULT;
    // SAFETY: loads the default control words; no memory is written.
    unsafe {
        core::arch::asm!(
            "ldmxcsr [{m}]",
            "fldcw [{f}]",
            m = in(reg) &mxcsr,
            f = in(reg) &fcw,
            options(nostack, readonly),
        );
    }
}

/// The instruction pointer of a handed-over context.
#[inline]
pub fn pc(ctx: &UserContext) -> u64 {
    ctx.rip
}

/// Moves a handed-over context's instruction pointer (a restartable sequence rewound).
#[inline]
pub fn set_pc(ctx: &mut UserContext, pc: u64) {
    ctx.rip = pc;
}

/// The stack pointer of a handed-over context.
#[inline]
pub fn sp(ctx: &UserContext) -> u64 {
    ctx.gprs.rsp
}

/// The instruction pointer of the code an interrupt frame interrupted.
#[inline]
pub fn frame_pc(frame: &IrqFrame) -> u64 {
    frame.rip
}

/// Moves where an interrupt frame returns to (a restartable sequence rewound).
#[inline]
pub fn set_frame_pc(frame: &mut IrqFrame, pc: u64) {
    frame.rip = pc;
}

/// The stack pointer of the code an interrupt frame interrupted.
#[inline]
pub fn frame_sp(frame: &IrqFrame) -> u64 {
    frame.rsp()
}
