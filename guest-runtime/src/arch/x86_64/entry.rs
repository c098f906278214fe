//! The entry of a new activation (x86_64): the first instructions a NEWPROC runs, which save
//! the vCPU's previous runtime words on the new stack and claim the words for the new
//! activation, and what an upcall handler needs to make sense of a context taken inside them.

use core::mem::offset_of;

use activm_stub::arch::x86_64::percpu::{HOLD_OFFSET, PENDING_OFFSET};
use activm_stub::protocol::arch::x86_64::UserContext;

use super::cpu::{offset, Word};
pub use crate::arch::entry_words::{entry_address, window, InEntry, OldWords, CLAIMING};

/// Where an interrupt taken at a new activation's first instruction leaves that instruction's
/// address: the stub pushes `[vector, error code, rflags, rip]` under the entry's stack pointer,
/// `top - 8`. The entry's own first stores overwrite it (with `top`), and a stack is cleared
/// there when given back, so this word names the entry only while such an interrupt's handler
/// (or one nested in it) runs before the entry did anything.
pub const ENTRY_MARK_OFFSET: u64 = 16;

// The Rust side, `upcall::entry`, is called by its symbol (`extern "C"`, arguments: vCPU,
// activation, stack top, saved words).

core::arch::global_asm!(
    ".pushsection .text.activm_rt.entry, \"ax\"",
    // A new activation (NEWPROC): rdi = vCPU, rsi = activation id, rsp = stack top - 8 (a
    // zero return address there), interrupts on. Until the words are reset an interrupt must
    // not trust them: [__rt_act_window_start, __rt_act_window_end) is an unsafe window.
    ".globl __rt_activation_entry",
    "__rt_activation_entry:",
    ".globl __rt_act_window_start",
    "__rt_act_window_start:",
    "    sub $56, %rsp",
    "    mov %gs:{current}, %rax",
    "    mov %rax, 0(%rsp)",
    "    mov %gs:{in_sched}, %rax",
    "    mov %rax, 8(%rsp)",
    "    mov %gs:{sched_idle}, %rax",
    "    mov %rax, 16(%rsp)",
    "    mov %gs:{sched_top}, %rax",
    "    mov %rax, 24(%rsp)",
    "    mov %gs:{hold}, %rax",
    "    mov %rax, 32(%rsp)",
    "    lea 64(%rsp), %rax",
    "    mov %rax, 48(%rsp)",
    "    mov %rsi, %rax",
    "    bts ${claiming_bit}, %rax",
    // The claim: this vCPU's words are now this activation's, still being reset (tagged
    // CLAIMING); rax = the previous activation.
    "    xchg %rax, %gs:{activation}",
    ".globl __rt_act_claimed",
    "__rt_act_claimed:",
    "    mov %rax, 40(%rsp)",
    "    movq $1, %gs:{in_sched}",
    "    movq $0, %gs:{current}",
    "    movq $0, %gs:{hold}",
    "    movq $0, %gs:{pending}",
    "    movq $0, %gs:{sched_idle}",
    "    movq $0, %gs:{armed}",
    "    lea 64(%rsp), %rax",
    "    mov %rax, %gs:{sched_top}",
    // The words are whole: drop the tag (the window's last instruction).
    "    mov %rsi, %gs:{activation}",
    ".globl __rt_act_window_end",
    "__rt_act_window_end:",
    "    mov %rsp, %rcx",
    "    lea 64(%rsp), %rdx",
    "    xor %ebp, %ebp",
    "    call __rt_activation_start",
    "    ud2",
    ".popsection",
    current = const offset(Word::Current),
    in_sched = const offset(Word::InSched),
    sched_idle = const offset(Word::SchedIdle),
    sched_top = const offset(Word::SchedTop),
    activation = const offset(Word::Activation),
    armed = const offset(Word::Armed),
    hold = const HOLD_OFFSET,
    pending = const PENDING_OFFSET,
    claiming_bit = const CLAIMING.trailing_zeros(),

    options(att_syntax),
);

const _: () = {
    assert!(offset_of!(OldWords, current) == 0);
    assert!(offset_of!(OldWords, in_sched) == 8);
    assert!(offset_of!(OldWords, sched_idle) == 16);
    assert!(offset_of!(OldWords, sched_top) == 24);
    assert!(offset_of!(OldWords, hold) == 32);
    assert!(offset_of!(OldWords, activation) == 40);
    assert!(offset_of!(OldWords, new_top) == 48);
};

/// The entry's stack pointer after its first instruction (`sub $56`) is `top - 64`; the stub's
/// frame of an interrupt taken there ends right under it, with the entry's `rip` at `top - 72`
/// (cleared when a stack is given back) and, once the trampoline saved it, its `rax` at
/// `top - 104`.
pub const ENTRY_RIP_OFFSET: u64 = 72;

/// Whether `ctx`, on the activation stack whose top is `top`, was taken in an interrupt handler
/// running on top of that activation's entry after its first instruction and before the end of
/// its window (the handler only deferred), and what the entry had done.
pub fn under_entry_interrupt(ctx: &UserContext, top: u64) -> Option<InEntry> {
    let (start, claimed, end) = window();
    let rsp = top - 64;
    // Below the stub's frame and the registers the trampoline pushed: inside the handler.
    if ctx.gprs.rsp >= rsp - 40 {
        return None;
    }
    // SAFETY: `rsp - 40 .. rsp` lies inside the activation stack below `top` (the caller found
    // `top` as a registered stack holding `ctx`'s stack pointer), guest memory.
    let (rip, rax) = unsafe {
        (
            ((top - ENTRY_RIP_OFFSET) as *const u64).read_volatile(),
            ((rsp - 40) as *const u64).read_volatile(),
        )
    };
    if !(start < rip && rip < end) {
        return None;
    }
    let saved = (rip >= claimed).then(|| {
        // SAFETY: the entry saved the words at rsp (its `sub $56` ran before the claim).
        let mut old = unsafe { *(rsp as *const OldWords) };
        if rip == claimed {
            old.activation = rax;
        }
        old
    });
    Some(InEntry {
        pc: rip,
        stack_top: top,
        saved,
    })
}

/// Whether `ctx` was taken inside an activation entry, and what it had done.
pub fn in_entry(ctx: &UserContext) -> Option<InEntry> {
    let (start, claimed, end) = window();
    // An interrupt pending when the activation started is delivered before (or between) its
    // first instructions; taken in the stub's trampoline before that saved anything, the
    // context is the trampoline's, and the entry's own rip and rsp are in the 4-word frame the
    // CPL0 stub pushed at rsp: vector, error code, rflags, rip (then the interrupted rsp).
    // A second interrupt can arrive at the trampoline's first instruction: follow the frames.
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    let (mut rip, mut rsp) = (ctx.rip, ctx.gprs.rsp);
    for _ in 0..8 {
        if !(trap_start..=trap_end).contains(&rip) {
            break;
        }
        // SAFETY: the trampoline pushes nothing before `trap_end`, so the stub's frame is at
        // rsp, in this guest's memory (the interrupted stack).
        let frame = unsafe { *(rsp as *const [u64; 4]) };
        (rip, rsp) = (frame[3], rsp + 32);
    }
    if !(start..end).contains(&rip) {
        return None;
    }
    let stack_top = if rip == start { rsp + 8 } else { rsp + 64 };
    let saved = (rip >= claimed).then(|| {
        // SAFETY: the entry saved the words at rsp (its `sub $56` ran before the claim).
        let mut old = unsafe { *(rsp as *const OldWords) };
        if rip == claimed {
            old.activation = ctx.gprs.rax;
        }
        old
    });
    Some(InEntry {
        pc: rip,
        stack_top,
        saved,
    })
}
