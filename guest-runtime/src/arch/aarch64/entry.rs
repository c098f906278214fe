//! The entry of a new activation (aarch64): the first instructions a NEWPROC runs, which save
//! the vCPU's previous runtime words on the new stack and claim the words for the new
//! activation, and what an upcall handler needs to make sense of a context taken inside them.
//! The protocol is x86_64's (see there); the claim is an exclusive pair (no LSE `swpal` on
//! ARMv8.0), so a context taken at the pair's `cbnz` has claimed iff its status register is 0.

use core::mem::offset_of;

use activm_stub::arch::aarch64::percpu::{HOLD_OFFSET, PENDING_OFFSET};
use activm_stub::protocol::arch::aarch64::UserContext;

use super::cpu::{offset, Word};
pub use crate::arch::entry_words::{entry_address, window, InEntry, OldWords, CLAIMING};

/// Where an interrupt taken at a new activation's first instruction leaves that instruction's
/// address: the stub's EL1 entry writes the 48-byte `IrqFrame` at `top - 48`, its `pc` at
/// `top - 32`. The entry's own stores overwrite it (`OldWords::hold`), and a stack is cleared
/// there when given back.
pub const ENTRY_MARK_OFFSET: u64 = 32;

// The Rust side, `upcall::entry`, is called by its symbol (`extern "C"`, arguments: vCPU,
// activation, stack top, saved words).

core::arch::global_asm!(
    ".pushsection .text.activm_rt.entry, \"ax\"",
    // A new activation (NEWPROC): x0 = vCPU, x1 = activation id, sp = stack top, x30 = 0,
    // interrupts on. [__rt_act_window_start, __rt_act_window_end) is the unsafe window.
    ".globl __rt_activation_entry",
    "__rt_activation_entry:",
    ".globl __rt_act_window_start",
    "__rt_act_window_start:",
    "    sub sp, sp, #64",
    "    mrs x9, tpidrro_el0",
    "    ldr x10, [x9, #{current}]",
    "    str x10, [sp, #0]",
    "    ldr x10, [x9, #{in_sched}]",
    "    str x10, [sp, #8]",
    "    ldr x10, [x9, #{sched_idle}]",
    "    str x10, [sp, #16]",
    "    ldr x10, [x9, #{sched_top}]",
    "    str x10, [sp, #24]",
    "    ldr x10, [x9, #{hold}]",
    "    str x10, [sp, #32]",
    "    add x10, sp, #64",
    "    str x10, [sp, #48]",
    "    orr x13, x1, #{claiming}",
    "    add x11, x9, #{activation}",
    // The claim: this vCPU's words are now this activation's, still being reset (tagged
    // CLAIMING); x10 = the previous activation, w12 = 0 once the store succeeded.
    "1:  ldaxr x10, [x11]",
    "    stlxr w12, x13, [x11]",
    ".globl __rt_act_claim_check",
    "__rt_act_claim_check:",
    "    cbnz w12, 1b",
    ".globl __rt_act_claimed",
    "__rt_act_claimed:",
    "    str x10, [sp, #40]",
    "    mov x10, #1",
    "    str x10, [x9, #{in_sched}]",
    "    str xzr, [x9, #{current}]",
    "    str xzr, [x9, #{hold}]",
    "    str xzr, [x9, #{pending}]",
    "    str xzr, [x9, #{sched_idle}]",
    "    str xzr, [x9, #{armed}]",
    "    add x10, sp, #64",
    "    str x10, [x9, #{sched_top}]",
    // The words are whole: drop the tag (the window's last instruction).
    "    str x1, [x9, #{activation}]",
    ".globl __rt_act_window_end",
    "__rt_act_window_end:",
    "    mov x3, sp",
    "    add x2, sp, #64",
    "    mov x29, #0",
    "    bl __rt_activation_start",
    "    udf #0",
    ".popsection",
    current = const offset(Word::Current),
    in_sched = const offset(Word::InSched),
    sched_idle = const offset(Word::SchedIdle),
    sched_top = const offset(Word::SchedTop),
    activation = const offset(Word::Activation),
    armed = const offset(Word::Armed),
    hold = const HOLD_OFFSET,
    pending = const PENDING_OFFSET,
    claiming = const CLAIMING,
);

const _: () = {
    assert!(offset_of!(OldWords, current) == 0);
    assert!(offset_of!(OldWords, in_sched) == 8);
    assert!(offset_of!(OldWords, sched_idle) == 16);
    assert!(offset_of!(OldWords, sched_top) == 24);
    assert!(offset_of!(OldWords, hold) == 32);
    assert!(offset_of!(OldWords, activation) == 40);
    assert!(offset_of!(OldWords, new_top) == 48);
    assert!(ENTRY_MARK_OFFSET == 64 - 32);
};

extern "C" {
    static __rt_act_claim_check: u8;
}

/// The entry's stack pointer after its first instruction (`sub sp, sp, #64`) is `top - 64`; the
/// stub's frame of an interrupt taken there is at `top - 112`, with the entry's `pc` at
/// `top - 96` (cleared when a stack is given back), and the trampoline's save area below it.
pub const ENTRY_RIP_OFFSET: u64 = 96;
const ENTRY_FRAME_OFFSET: u64 = 112;

/// Whether `ctx`, on the activation stack whose top is `top`, was taken in an interrupt handler
/// running on top of that activation's entry after its first instruction and before the end of
/// its window (the handler only deferred), and what the entry had done.
pub fn under_entry_interrupt(ctx: &UserContext, top: u64) -> Option<InEntry> {
    let (start, claimed, end) = window();
    let sp = top - 64;
    let save_at = top - ENTRY_FRAME_OFFSET - super::context::SAVE_SIZE as u64;
    // Below the trampoline's save area (complete once the handler was called): inside it.
    if ctx.sp >= save_at {
        return None;
    }
    // SAFETY: the frame and save area lie inside the activation stack below `top` (the caller
    // found `top` as a registered stack holding `ctx`'s stack pointer), guest memory.
    let (pc, x10, x12) = unsafe {
        (
            ((top - ENTRY_RIP_OFFSET) as *const u64).read_volatile(),
            ((save_at + 8 * (10 - 2)) as *const u64).read_volatile(),
            ((save_at + 8 * (12 - 2)) as *const u64).read_volatile(),
        )
    };
    if !(start < pc && pc < end) {
        return None;
    }
    let check = core::ptr::addr_of!(__rt_act_claim_check) as u64;
    let has_claimed = pc >= claimed || (pc == check && x12 as u32 == 0);
    let saved = has_claimed.then(|| {
        // SAFETY: the entry saved the words at sp (its `sub sp` ran before the claim).
        let mut old = unsafe { *(sp as *const OldWords) };
        if pc <= claimed {
            old.activation = x10;
        }
        old
    });
    Some(InEntry {
        pc,
        stack_top: top,
        saved,
    })
}

/// Whether `ctx` was taken inside an activation entry, and what it had done. The stub EOIs at
/// EL1, so there is no trampoline window to look through (unlike x86_64).
pub fn in_entry(ctx: &UserContext) -> Option<InEntry> {
    let (start, claimed, end) = window();
    let (pc, sp) = (ctx.pc, ctx.sp);
    if !(start..end).contains(&pc) {
        return None;
    }
    let stack_top = if pc == start { sp } else { sp + 64 };
    let check = core::ptr::addr_of!(__rt_act_claim_check) as u64;
    let has_claimed = pc >= claimed || (pc == check && ctx.x[12] as u32 == 0);
    let saved = has_claimed.then(|| {
        // SAFETY: the entry saved the words at sp (its `sub sp` ran before the claim).
        let mut old = unsafe { *(sp as *const OldWords) };
        if pc <= claimed {
            old.activation = ctx.x[10];
        }
        old
    });
    Some(InEntry {
        pc,
        stack_top,
        saved,
    })
}
