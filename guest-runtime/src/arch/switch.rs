//! The Rust side of the context switches, the same on every architecture: each architecture's
//! `context.rs` emits the `__rt_*` switch routines in assembly, with its own switch frame, and
//! re-exports these wrappers.

extern "C" {
    fn __rt_suspend_scheduler(new_top: u64, f: extern "C" fn(u64, u64) -> !);
    fn __rt_resume_switch_frame(sp: usize, release: u64) -> !;
    fn __rt_switch_out(t: *mut u8, action: usize, arg: usize);
    fn __rt_switch_in(t: *const u8) -> !;
}

/// Saves the running thread `t` (its TCB's first word receives the stack pointer) and runs the
/// scheduler entry with `(t, action, arg)`; returns when `t` is switched in again, possibly on
/// another vCPU.
///
/// # Safety
/// `t` is the TCB of the thread running this code, this vCPU is not in the scheduler, and
/// nothing is held (`activm_stub::preempt::held() == 0`).
#[inline(always)]
pub unsafe fn switch_out(t: *mut u8, action: usize, arg: usize) {
    // SAFETY: the caller guarantees the conditions above; the assembly saves every register the
    // ABI asks a callee to keep, plus the floating-point control state and (aarch64) TPIDR_EL0,
    // and returns normally when resumed.
    unsafe { __rt_switch_out(t, action, arg) }
}

/// Makes `t` this vCPU's current thread and continues it from its saved stack pointer.
///
/// # Safety
/// Called in the scheduler (`Word::InSched` = 1) on this activation's stack, with nothing of
/// the caller's frames needed afterwards; `t`'s saved stack pointer points at a switch frame
/// and no other vCPU runs `t`.
#[inline(always)]
pub unsafe fn switch_in(t: *const u8) -> ! {
    // SAFETY: the caller guarantees the conditions above.
    unsafe { __rt_switch_in(t) }
}

/// Suspends the running scheduler: its state stays in a switch frame on its stack, this vCPU's
/// scheduler moves to the stack at `new_top`, where `f(frame_sp, old_stack_top)` runs. Returns
/// when another scheduler adopts the frame ([`resume_switch_frame`]), on whatever vCPU.
///
/// # Safety
/// Scheduler context; `new_top` is a free activation stack (16-byte aligned top).
pub unsafe fn suspend_scheduler(new_top: u64, f: extern "C" fn(u64, u64) -> !) {
    // SAFETY: the caller guarantees the conditions; the assembly saves the callee-saved state
    // and comes back through `resume_switch_frame`.
    unsafe { __rt_suspend_scheduler(new_top, f) }
}

/// Continues a scheduler suspended by [`suspend_scheduler`] (its switch frame at `sp`) as this
/// vCPU's scheduler; once on its stack, gives back `release` (the stack the caller leaves; 0:
/// none) with `__rt_release_left_stack` (by name: `activation::stacks`).
///
/// # Safety
/// Scheduler context; `sp` is such a frame on a stack nobody else uses, with free stack below
/// it; nothing runs on `release` after the switch.
pub unsafe fn resume_switch_frame(sp: usize, release: u64) -> ! {
    // SAFETY: as above.
    unsafe { __rt_resume_switch_frame(sp, release) }
}
