//! The heap's restartable sequences (aarch64): the same two as x86_64's (see there), each
//! reading TPIDRRO_EL0 afresh at its start and committing with one store of the stack's new
//! length; no exclusive or acquire/release access (only this vCPU reads its stacks, and a
//! context moved to another vCPU is rewound to the start).

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
    "    mrs x9, tpidrro_el0",
    "    ldr w10, [x9, #{vcpu}]",
    "    cmp w10, #{max}",
    "    b.hs 1f",
    "    adrp x11, {stacks}",
    "    add x11, x11, :lo12:{stacks}",
    "    add x11, x11, x10, lsl #{shift}",
    "    add x12, x11, #{len}",
    "    ldr x13, [x12, x0, lsl #3]",
    "    cbz x13, 1f",
    "    sub x13, x13, #1",
    "    add x14, x11, x0, lsl #{row_shift}",
    "    ldr x15, [x14, x13, lsl #3]",
    "    str x13, [x12, x0, lsl #3]",
    ".globl __stub_rseq_heap_take_end",
    "__stub_rseq_heap_take_end:",
    "    mov x0, x15",
    "    ret",
    "1:",
    "    mov x0, #0",
    "    ret",
    "",
    // fn __stub_heap_put(class: usize, block: *mut u8) -> bool (false if the stack is full)
    ".globl __stub_heap_put",
    "__stub_heap_put:",
    ".globl __stub_rseq_heap_put_start",
    "__stub_rseq_heap_put_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr w10, [x9, #{vcpu}]",
    "    cmp w10, #{max}",
    "    b.hs 1f",
    "    adrp x11, {stacks}",
    "    add x11, x11, :lo12:{stacks}",
    "    add x11, x11, x10, lsl #{shift}",
    "    add x12, x11, #{len}",
    "    ldr x13, [x12, x0, lsl #3]",
    "    cmp x13, #{entries}",
    "    b.hs 1f",
    "    add x14, x11, x0, lsl #{row_shift}",
    "    str x1, [x14, x13, lsl #3]",
    "    add x13, x13, #1",
    "    str x13, [x12, x0, lsl #3]",
    ".globl __stub_rseq_heap_put_end",
    "__stub_rseq_heap_put_end:",
    "    mov x0, #1",
    "    ret",
    "1:",
    "    mov x0, #0",
    "    ret",
    ".popsection",
    vcpu = const VCPU_OFFSET,
    max = const MAX_VCPUS,
    shift = const STACKS_SHIFT,
    stacks = sym STACKS,
    len = const offset_of!(Stacks, len),
    entries = const ENTRIES,
    row_shift = const (ENTRIES * 8).trailing_zeros(),
);

const _: () = assert!((ENTRIES * 8).is_power_of_two());
const _: () = assert!(offset_of!(Stacks, blocks) == 0);
const _: () = assert!(offset_of!(Stacks, len) < 4096);
