//! Thread contexts: voluntary switches, new threads, and full contexts (interrupted threads,
//! contexts handed over in upcall records).
//!
//! **Voluntary switch** (a plain call at EL0, no exception): [`switch_out`] stores the
//! callee-saved registers (x19-x30, d8-d15), FPCR and TPIDR_EL0 in a [`SwitchFrame`] on the
//! thread's stack, marks this vCPU as in the scheduler (`Word::InSched`), stores the stack
//! pointer in the thread's TCB (offset 0) and calls the scheduler entry on this activation's
//! stack (`Word::SchedTop`), which never returns. [`switch_in`] makes a thread current and loads
//! that frame. The order of the stores is x86_64's, for the same reasons (see there):
//! `InSched = 1` first, the stack pointer next; `switch_in` is a restartable sequence up to its
//! commit (`InSched = 0`), rewound to its start with `x0` = the thread; then the pending check.
//!
//! **Full contexts.** An interrupted thread's state is the stub's [`IrqFrame`] (x0, x1, pc,
//! pstate, intid, sp) on its own stack with the trampoline's save area below it (x2-x30, a spare
//! word, FPCR, FPSR, q0-q31: [`SAVE_SIZE`] bytes); a timer preemption switches away from inside
//! the handler and returns through the trampoline (`svc #0`) when resumed, on any vCPU. A
//! [`UserContext`] from an upcall record is resumed the same way: [`build_resume_frame`] writes
//! that layout below the context's stack pointer (TPIDR_EL0 in the spare word) plus a switch
//! frame whose return address is `__rt_resume_frame`, the trampoline's epilogue.

// The assembly calls the runtime by symbol (`extern "C"`, defined above this layer):
// `__rt_sched_entry(prev, action, arg)`, `__rt_thread_main(tcb)`, `__rt_safepoint()`,
// `__rt_release_left_stack(top)`.

use core::mem::{offset_of, size_of};

use activm_stub::arch::aarch64::percpu::PENDING_OFFSET;
use activm_stub::protocol::arch::aarch64::UserContext;
use activm_stub::IrqFrame;

use super::cpu::{offset, Word};

/// FPCR at thread start: round to nearest, no traps, no flush-to-zero.
pub const FPCR_DEFAULT: u64 = 0;
/// PSTATE bits a resumed context may carry (NZCV); the stub's `svc #0` path keeps only these.
const PSTATE_USER_MASK: u64 = 0xf000_0000;

/// The trampoline's save area below an [`IrqFrame`]: x2-x30 (29 words), the spare word (here
/// TPIDR_EL0 of a resumed context), FPCR, FPSR, q0-q31.
pub const SAVE_SIZE: usize = 30 * 8 + 16 + 32 * 16;
const SAVE_TPIDR: usize = 29 * 8;
const SAVE_FPCR: usize = 30 * 8;
const SAVE_Q: usize = 32 * 8;

/// The frame [`switch_out`] leaves at the saved stack pointer (16-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwitchFrame {
    /// x19..x28.
    pub x19_28: [u64; 10],
    pub x29: u64,
    /// The return address (x30).
    pub ret: u64,
    /// d8..d15.
    pub d8_15: [u64; 8],
    pub fpcr: u64,
    pub tpidr: u64,
}

const _: () = assert!(size_of::<SwitchFrame>() == 176);
const _: () = assert!(size_of::<IrqFrame>() == 48);
const _: () = assert!(SAVE_SIZE.is_multiple_of(16));

/// Stores the callee-saved state into a switch frame at `sp - 176` and moves `sp` there.
macro_rules! save_switch_frame {
    () => {
        concat!(
            "    sub sp, sp, #176\n",
            "    stp x19, x20, [sp, #0]\n",
            "    stp x21, x22, [sp, #16]\n",
            "    stp x23, x24, [sp, #32]\n",
            "    stp x25, x26, [sp, #48]\n",
            "    stp x27, x28, [sp, #64]\n",
            "    stp x29, x30, [sp, #80]\n",
            "    stp d8, d9, [sp, #96]\n",
            "    stp d10, d11, [sp, #112]\n",
            "    stp d12, d13, [sp, #128]\n",
            "    stp d14, d15, [sp, #144]\n",
            "    mrs x9, fpcr\n",
            "    mrs x10, tpidr_el0\n",
            "    stp x9, x10, [sp, #160]\n",
        )
    };
}

/// Loads the switch frame at `sp`, pops it and returns to its x30.
macro_rules! load_switch_frame_and_ret {
    () => {
        concat!(
            "    ldp x9, x10, [sp, #160]\n",
            "    msr fpcr, x9\n",
            "    msr tpidr_el0, x10\n",
            "    ldp d8, d9, [sp, #96]\n",
            "    ldp d10, d11, [sp, #112]\n",
            "    ldp d12, d13, [sp, #128]\n",
            "    ldp d14, d15, [sp, #144]\n",
            "    ldp x19, x20, [sp, #0]\n",
            "    ldp x21, x22, [sp, #16]\n",
            "    ldp x23, x24, [sp, #32]\n",
            "    ldp x25, x26, [sp, #48]\n",
            "    ldp x27, x28, [sp, #64]\n",
            "    ldp x29, x30, [sp, #80]\n",
            "    add sp, sp, #176\n",
            "    ret\n",
        )
    };
}

core::arch::global_asm!(
    ".pushsection .text.activm_rt.switch, \"ax\"",
    // fn __rt_switch_out(t: *mut Tcb, action: usize, arg: usize): returns when t is resumed.
    ".globl __rt_switch_out",
    ".type __rt_switch_out, %function",
    "__rt_switch_out:",
    save_switch_frame!(),
    // InSched = 1 on the vCPU this runs on now (exclusive pair: retried after a move).
    "    mov x10, #1",
    "1:  mrs x9, tpidrro_el0",
    "    add x9, x9, #{in_sched}",
    "    ldxr x11, [x9]",
    "    stxr w11, x10, [x9]",
    "    cbnz w11, 1b",
    // From here on handlers only defer: this vCPU is ours until the scheduler switches.
    "    mov x9, sp",
    "    str x9, [x0]",
    "    mrs x9, tpidrro_el0",
    "    ldr x9, [x9, #{sched_top}]",
    "    mov sp, x9",
    "    mov x29, #0",
    "    bl __rt_sched_entry",
    "    udf #0",
    ".size __rt_switch_out, . - __rt_switch_out",
    "",
    // The new-thread trampoline: switch_in returns here with x19 = the TCB.
    ".globl __rt_thread_start",
    "__rt_thread_start:",
    "    mov x0, x19",
    "    mov x29, #0",
    "    bl __rt_thread_main",
    "    udf #0",
    "",
    // The epilogue of a trap frame at x19 (IrqFrame, save area below): the stub trampoline's
    // after its handler returns, plus TPIDR_EL0 from the spare word.
    ".globl __rt_resume_frame",
    "__rt_resume_frame:",
    "    sub sp, x19, #{save}",
    "    ldr x9, [sp, #{save_tpidr}]",
    "    msr tpidr_el0, x9",
    "    add x9, sp, #{save_q}",
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
    "    ldp x9, x10, [sp, #{save_fpcr}]",
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
    "    add sp, sp, #{save}",
    "    svc #0",
    ".popsection",
    "",
    // fn __rt_switch_in(t: *const Tcb) -> !: a restartable sequence up to its commit.
    ".pushsection .text.activm_rt.rseq, \"ax\"",
    ".globl __rt_switch_in",
    ".type __rt_switch_in, %function",
    "__rt_switch_in:",
    ".globl __rt_rseq_switch_in_start",
    "__rt_rseq_switch_in_start:",
    "    mrs x9, tpidrro_el0",
    "    str x0, [x9, #{current}]",
    "    ldr x10, [x0]",
    "    mov sp, x10",
    "    str xzr, [x9, #{in_sched}]",
    ".globl __rt_rseq_switch_in_end",
    "__rt_rseq_switch_in_end:",
    "    ldr x10, [x9, #{pending}]",
    "    cbnz x10, 2f",
    "1:",
    load_switch_frame_and_ret!(),
    "2:",
    "    bl __rt_safepoint",
    "    b 1b",
    ".size __rt_switch_in, . - __rt_switch_in",
    ".popsection",
    "",
    ".pushsection .text.activm_rt.switch, \"ax\"",
    // fn __rt_suspend_scheduler(new_top: u64, f: extern fn(sp, old_top) -> !): see x86_64.
    ".globl __rt_suspend_scheduler",
    "__rt_suspend_scheduler:",
    save_switch_frame!(),
    "    mov x12, x1",
    "    mrs x9, tpidrro_el0",
    "    ldr x1, [x9, #{sched_top}]",
    "    str x0, [x9, #{sched_top}]",
    "    mov x10, sp",
    "    mov sp, x0",
    "    mov x0, x10",
    "    mov x29, #0",
    "    blr x12",
    "    udf #0",
    ".globl __rt_resume_switch_frame",
    "__rt_resume_switch_frame:",
    "    mov sp, x0",
    "    mov x20, x0",
    "    mov x0, x1",
    "    bl __rt_release_left_stack",
    "    mov sp, x20",
    "    mov x0, #0",
    load_switch_frame_and_ret!(),
    ".popsection",
    in_sched = const offset(Word::InSched),
    sched_top = const offset(Word::SchedTop),
    current = const offset(Word::Current),
    pending = const PENDING_OFFSET,
    save = const SAVE_SIZE,
    save_tpidr = const SAVE_TPIDR,
    save_fpcr = const SAVE_FPCR,
    save_q = const SAVE_Q,
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
/// `[stack_top - 176, stack_top)` is writable memory of the thread's unused stack.
pub unsafe fn build_start_frame(stack_top: usize, tcb: *const u8) -> usize {
    let sp = stack_top - size_of::<SwitchFrame>();
    let mut frame = SwitchFrame {
        fpcr: FPCR_DEFAULT,
        ret: __rt_thread_start as *const () as u64,
        ..SwitchFrame::default()
    };
    frame.x19_28[0] = tcb as u64;
    // SAFETY: the caller guarantees the memory; sp is 16-byte aligned (stack_top is).
    unsafe { (sp as *mut SwitchFrame).write(frame) };
    sp
}

/// The trap frame a resumed context needs, below `sp`: the frame's address.
pub const fn trap_frame_at(sp: u64) -> u64 {
    (sp - size_of::<IrqFrame>() as u64) & !15
}

/// Writes `ctx` as a trap frame (and the save area below it) under `ctx.sp`, plus a switch
/// frame below that which [`switch_in`] turns into a return through `__rt_resume_frame`;
/// returns the stack pointer to store in the thread's TCB. The context's pc must already be
/// fixed up (restartable sequences rewound).
///
/// # Safety
/// The 1 KiB below `ctx.sp` is free stack memory nobody else uses (the guests have no red
/// zone), and `ctx` was taken from this guest at EL0.
pub unsafe fn build_resume_frame(ctx: &UserContext) -> usize {
    let frame_at = trap_frame_at(ctx.sp);
    let frame = IrqFrame {
        x0: ctx.x[0],
        x1: ctx.x[1],
        pc: ctx.pc,
        pstate: ctx.pstate & PSTATE_USER_MASK,
        intid: 0,
        sp: ctx.sp,
    };
    let save_at = frame_at - SAVE_SIZE as u64;
    let sp = save_at - size_of::<SwitchFrame>() as u64;
    let mut switch = SwitchFrame {
        fpcr: FPCR_DEFAULT,
        ret: __rt_resume_frame as *const () as u64,
        ..SwitchFrame::default()
    };
    switch.x19_28[0] = frame_at;
    let save = save_at as *mut u64;
    // SAFETY: the caller guarantees the memory below ctx.sp; every write is aligned and inside
    // [sp, ctx.sp).
    unsafe {
        (frame_at as *mut IrqFrame).write(frame);
        for (i, x) in ctx.x[2..].iter().enumerate() {
            save.add(i).write(*x);
        }
        save.byte_add(SAVE_TPIDR).write(ctx.tpidr_el0);
        save.byte_add(SAVE_FPCR).write(ctx.fpcr);
        save.byte_add(SAVE_FPCR + 8).write(ctx.fpsr);
        (save.byte_add(SAVE_Q) as *mut [u128; 32]).write(ctx.q);
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
    // SAFETY: the caller guarantees a switch frame at sp (16-byte aligned) whose x19 is a trap
    // frame, and free stack below it (the release call runs there); the epilogue restores
    // everything from the frame.
    unsafe {
        core::arch::asm!(
            "mov sp, x0",
            "mov x20, x0",
            "mov x0, x1",
            "bl __rt_release_left_stack",
            "mov x0, x20",
            "ldr x19, [x0, {x19}]",
            "b {resume}",
            in("x0") sp,
            in("x1") release,
            x19 = const offset_of!(SwitchFrame, x19_28),
                    resume = sym __rt_resume_frame,
            options(noreturn),
        )
    }
}

/// The save area the stub's trampoline put below `frame`.
fn saved_area(frame: &IrqFrame) -> *const u64 {
    (frame as *const IrqFrame as u64 - SAVE_SIZE as u64) as *const u64
}

/// The complete context of the code `frame` interrupted (what the VMM would hand over).
pub fn capture(frame: &IrqFrame) -> UserContext {
    let save = saved_area(frame);
    let mut ctx = UserContext {
        sp: frame.sp,
        pc: frame.pc,
        pstate: frame.pstate,
        ..UserContext::default()
    };
    ctx.x[0] = frame.x0;
    ctx.x[1] = frame.x1;
    // SAFETY: the stub's trampoline (or `build_resume_frame`) wrote the save area right below
    // the frame, on the same stack, live while the frame is; TPIDR_EL0 is still the
    // interrupted code's (handlers do not change it).
    unsafe {
        for (i, x) in ctx.x[2..].iter_mut().enumerate() {
            *x = save.add(i).read();
        }
        ctx.fpcr = save.byte_add(SAVE_FPCR).read();
        ctx.fpsr = save.byte_add(SAVE_FPCR + 8).read();
        ctx.q = (save.byte_add(SAVE_Q) as *const [u128; 32]).read();
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) ctx.tpidr_el0, options(nomem, nostack));
    }
    ctx
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
            "mrs x9, tpidrro_el0",
            "ldr x9, [x9, {top}]",
            "mov sp, x9",
            "mov x29, #0",
            "blr x12",
            "udf #0",
            top = const offset(Word::SchedTop),
            in("x12") f,
            options(noreturn),
        )
    }
}

/// Resets FPCR (a new activation starts with whatever the vCPU had).
pub fn reset_fp_control() {
    // SAFETY: writes the default FP control register; no memory is touched.
    unsafe { core::arch::asm!("msr fpcr, {}", in(reg) FPCR_DEFAULT, options(nomem, nostack)) };
}

/// The program counter of a handed-over context.
#[inline]
pub fn pc(ctx: &UserContext) -> u64 {
    ctx.pc
}

/// Moves a handed-over context's program counter (a restartable sequence rewound).
#[inline]
pub fn set_pc(ctx: &mut UserContext, pc: u64) {
    ctx.pc = pc;
}

/// The stack pointer of a handed-over context.
#[inline]
pub fn sp(ctx: &UserContext) -> u64 {
    ctx.sp
}

/// The program counter of the code an interrupt frame interrupted.
#[inline]
pub fn frame_pc(frame: &IrqFrame) -> u64 {
    frame.pc
}

/// Moves where an interrupt frame returns to (a restartable sequence rewound).
#[inline]
pub fn set_frame_pc(frame: &mut IrqFrame, pc: u64) {
    frame.pc = pc;
}

/// The stack pointer of the code an interrupt frame interrupted.
#[inline]
pub fn frame_sp(frame: &IrqFrame) -> u64 {
    frame.sp
}
