//! Restartable sequences: the per-vCPU operations, written so that being interrupted (and
//! perhaps moved to another vCPU) anywhere before their single committing instruction is undone
//! by restarting them (Anderson's PC-range recovery, Williams 2002, section 6; Anderson et al. 1992, section 4.3).
//!
//! Each sequence reads `%gs` afresh at its start, does its work in registers or in slots nobody
//! else reads yet, and publishes with one instruction (a store or a `lock cmpxchg`). Its
//! `[start, end)` range and abort address are registered in a table (`__rt_rseq_table`). An
//! interrupt handler whose interrupted `rip` lies in a range, or the upcall handler resuming a
//! context (from a PREEMPTED record) whose `rip` does, sets `rip` to the abort address (here
//! always the start) before doing anything else: the common case costs nothing.
//!
//! The sequences: [`rq_push`] and [`rq_pop`] (this vCPU's run queue), `__rt_switch_in` (making a
//! thread current, see `context`), [`take_record`] (this vCPU's upcall queue), [`idle_halt`]
//! (check for deferred work, then the `halt` hypercall: an interrupt between the two rewinds to
//! the check, so no wake-up is lost), [`probe_increment`] (a deliberately long sequence for
//! the tests), and the stub heap's two (a small block taken from or given to this vCPU's cache,
//! `activm_stub::heap::use_restartable_caches`), listed here and turned on at start-up.

use core::mem::{offset_of, size_of};

use activm_stub::arch::x86_64::percpu::PENDING_OFFSET;
use activm_stub::protocol::arch::x86_64::HYPERCALL_BASE;
use activm_stub::protocol::hypercall::Hypercall;
use activm_stub::protocol::shared::{UpcallRecord, VcpuArea, UPCALL_QUEUE_CAPACITY};

use super::cpu::{offset, Word};
use crate::percpu::{Pcpu, RQ_CAP};

const _: () = assert!(RQ_CAP.is_power_of_two());
const _: () = assert!(size_of::<UpcallRecord>().is_multiple_of(8));
const _: () = assert!(UPCALL_QUEUE_CAPACITY.is_power_of_two());

core::arch::global_asm!(
    ".pushsection .text.activm_rt.rseq, \"ax\"",
    // fn __rt_rq_push(t: *const Tcb) -> bool
    ".globl __rt_rq_push",
    "__rt_rq_push:",
    "__rt_rseq_push_start:",
    "    mov %gs:{pcpu}, %rcx",
    "    mov {tail}(%rcx), %edx",
    "    mov {head}(%rcx), %eax",
    "    mov %edx, %r8d",
    "    sub %eax, %r8d",
    "    cmp ${cap}, %r8d",
    "    jae 1f",
    "    mov %edx, %r8d",
    "    and ${mask}, %r8d",
    "    mov %rdi, {ring}(%rcx, %r8, 8)",
    "    inc %edx",
    "    mov %edx, {tail}(%rcx)",
    "__rt_rseq_push_end:",
    "    mov $1, %eax",
    "    ret",
    "1:",
    "    xor %eax, %eax",
    "    ret",
    "",
    // fn __rt_rq_pop() -> *const Tcb (null if empty)
    ".globl __rt_rq_pop",
    "__rt_rq_pop:",
    "__rt_rseq_pop_start:",
    "    mov %gs:{pcpu}, %rcx",
    "    mov {head}(%rcx), %eax",
    "    mov {tail}(%rcx), %edx",
    "    cmp %eax, %edx",
    "    je 1f",
    "    mov %eax, %r8d",
    "    and ${mask}, %r8d",
    "    mov {ring}(%rcx, %r8, 8), %rsi",
    "    lea 1(%rax), %r9d",
    "    lock cmpxchg %r9d, {head}(%rcx)",
    "__rt_rseq_pop_end:",
    "    jne __rt_rseq_pop_start",
    "    mov %rsi, %rax",
    "    ret",
    "1:",
    "    xor %eax, %eax",
    "    ret",
    "",
    // fn __rt_take_record(dst: *mut UpcallRecord) -> bool: copy the record at this vCPU's queue
    // tail, then publish tail + 1.
    ".globl __rt_take_record",
    "__rt_take_record:",
    "    mov %rdi, %r8",
    "__rt_rseq_take_start:",
    "    mov %gs:{area}, %r9",
    "    mov {qhead}(%r9), %eax",
    "    mov {qtail}(%r9), %edx",
    "    cmp %eax, %edx",
    "    je 1f",
    "    mov %edx, %esi",
    "    and ${qmask}, %esi",
    "    imul ${rec_size}, %rsi, %rsi",
    "    lea {records}(%r9, %rsi), %rsi",
    "    mov %r8, %rdi",
    "    mov ${rec_words}, %ecx",
    "    rep movsq",
    "    inc %edx",
    "    mov %edx, {qtail}(%r9)",
    "__rt_rseq_take_end:",
    "    mov $1, %eax",
    "    ret",
    "1:",
    "    xor %eax, %eax",
    "    ret",
    "",
    // fn __rt_idle_halt(): halt unless this vCPU has deferred work.
    ".globl __rt_idle_halt",
    "__rt_idle_halt:",
    "__rt_rseq_halt_start:",
    "    cmpq $0, %gs:{pending}",
    "    jne 1f",
    "    movabs ${halt}, %rax",
    "    mov (%rax), %rax",
    "__rt_rseq_halt_end:",
    "1:",
    "    ret",
    "",
    // fn __rt_probe_increment(spins: u64): this vCPU's probe counter += 1, with a long body.
    ".globl __rt_probe_increment",
    "__rt_probe_increment:",
    "__rt_rseq_probe_start:",
    "    mov %gs:{pcpu}, %rcx",
    "    mov {probe}(%rcx), %rax",
    "    mov %rdi, %rdx",
    "2:",
    "    pause",
    "    dec %rdx",
    "    jnz 2b",
    "    inc %rax",
    "    mov %rax, {probe}(%rcx)",
    "__rt_rseq_probe_end:",
    "    ret",
    ".popsection",
    "",
    ".pushsection .rodata.activm_rt.rseq, \"a\"",
    ".balign 8",
    ".globl __rt_rseq_table",
    "__rt_rseq_table:",
    "    .quad __rt_rseq_push_start, __rt_rseq_push_end, __rt_rseq_push_start",
    "    .quad __rt_rseq_pop_start, __rt_rseq_pop_end, __rt_rseq_pop_start",
    "    .quad __rt_rseq_take_start, __rt_rseq_take_end, __rt_rseq_take_start",
    "    .quad __rt_rseq_halt_start, __rt_rseq_halt_end, __rt_rseq_halt_start",
    "    .quad __rt_rseq_probe_start, __rt_rseq_probe_end, __rt_rseq_probe_start",
    "    .quad __rt_rseq_switch_in_start, __rt_rseq_switch_in_end, __rt_rseq_switch_in_start",
    // The heap's small-block caches (activm_stub::heap, `arch::*::heap`).
    "    .quad __stub_rseq_heap_take_start, __stub_rseq_heap_take_end, __stub_rseq_heap_take_start",
    "    .quad __stub_rseq_heap_put_start, __stub_rseq_heap_put_end, __stub_rseq_heap_put_start",
    ".globl __rt_rseq_table_end",
    "__rt_rseq_table_end:",
    ".popsection",
    pcpu = const offset(Word::Pcpu),
    area = const offset(Word::Area),
    pending = const PENDING_OFFSET,
    tail = const offset_of!(Pcpu, tail),
    head = const offset_of!(Pcpu, head),
    ring = const offset_of!(Pcpu, ring),
    probe = const offset_of!(Pcpu, probe),
    cap = const RQ_CAP,
    mask = const RQ_CAP - 1,
    qhead = const offset_of!(VcpuArea, queue_head),
    qtail = const offset_of!(VcpuArea, queue_tail),
    records = const offset_of!(VcpuArea, records),
    qmask = const UPCALL_QUEUE_CAPACITY - 1,
    rec_size = const size_of::<UpcallRecord>(),
    rec_words = const size_of::<UpcallRecord>() / 8,
    halt = const Hypercall::Halt.address(HYPERCALL_BASE),
    options(att_syntax),
);

pub use crate::arch::sequences::{fixup, idle_halt, probe_increment, rq_pop, rq_push, take_record};
