//! The heap's restartable sequences (x86_64): take a block from, or give one to, this vCPU's
//! stack of small blocks of one size class (`crate::heap::small`), without a locked
//! instruction. Each reads `%gs` afresh at its start, touches only this vCPU's stacks, and
//! commits with one store of the stack's new length. They are correct only where every
//! interrupt handler, and every resumption of a context the VMM handed over, first rewinds an
//! instruction pointer inside `[start, end)` to `start`: the thread runtime lists them in its
//! restartable-sequence table (`__stub_rseq_heap_*` symbols) and then turns them on
//! (`crate::heap::use_restartable_caches`).

use core::mem::offset_of;

use protocol::MAX_VCPUS;

use super::percpu::VCPU_OFFSET;
use crate::heap::small::{Stacks, ENTRIES, STACKS, STACKS_SHIFT};

core::arch::global_asm!(
    ".pushsection .text.activm_stub.heap_rseq, \"ax\"",
    // fn __stub_heap_take(class: usize) -> *mut u8 (null if this vCPU's stack is empty)
    ".globl __stub_heap_take",
    "__stub_heap_take:",
    ".globl __stub_rseq_heap_take_start",
    "__stub_rseq_heap_take_start:",
    "    mov %gs:{vcpu}, %eax",
    "    cmp ${max}, %eax",
    "    jae 1f",
    "    shl ${shift}, %rax",
    "    lea {stacks}(%rip), %rcx",
    "    add %rax, %rcx",
    "    mov {len}(%rcx, %rdi, 8), %rdx",
    "    test %rdx, %rdx",
    "    jz 1f",
    "    dec %rdx",
    "    mov %rdi, %rsi",
    "    shl ${row_shift}, %rsi",
    "    add %rcx, %rsi",
    "    mov (%rsi, %rdx, 8), %rax",
    "    mov %rdx, {len}(%rcx, %rdi, 8)",
    ".globl __stub_rseq_heap_take_end",
    "__stub_rseq_heap_take_end:",
    "    ret",
    "1:",
    "    xor %eax, %eax",
    "    ret",
    "",
    // fn __stub_heap_put(class: usize, block: *mut u8) -> bool (false if the stack is full)
    ".globl __stub_heap_put",
    "__stub_heap_put:",
    ".globl __stub_rseq_heap_put_start",
    "__stub_rseq_heap_put_start:",
    "    mov %gs:{vcpu}, %eax",
    "    cmp ${max}, %eax",
    "    jae 1f",
    "    shl ${shift}, %rax",
    "    lea {stacks}(%rip), %rcx",
    "    add %rax, %rcx",
    "    mov {len}(%rcx, %rdi, 8), %rdx",
    "    cmp ${entries}, %rdx",
    "    jae 1f",
    "    mov %rdi, %r8",
    "    shl ${row_shift}, %r8",
    "    add %rcx, %r8",
    "    mov %rsi, (%r8, %rdx, 8)",
    "    inc %rdx",
    "    mov %rdx, {len}(%rcx, %rdi, 8)",
    ".globl __stub_rseq_heap_put_end",
    "__stub_rseq_heap_put_end:",
    "    mov $1, %eax",
    "    ret",
    "1:",
    "    xor %eax, %eax",
    "    ret",
    ".popsection",
    vcpu = const VCPU_OFFSET,
    max = const MAX_VCPUS,
    shift = const STACKS_SHIFT,
    stacks = sym STACKS,
    len = const offset_of!(Stacks, len),
    entries = const ENTRIES,
    row_shift = const (ENTRIES * 8).trailing_zeros(),
    options(att_syntax),
);

const _: () = assert!((ENTRIES * 8).is_power_of_two());
const _: () = assert!(offset_of!(Stacks, blocks) == 0);
