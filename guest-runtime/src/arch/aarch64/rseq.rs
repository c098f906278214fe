//! Restartable sequences (aarch64): the same per-vCPU operations as x86_64's (see there for the
//! idea and the list), each reading TPIDRRO_EL0 afresh at its start and publishing with one
//! instruction (a store-release `stlr`, or a store-exclusive `stlxr` whose failure restarts the
//! sequence). An interrupt or a handed-over context inside `[start, end)` is rewound to the
//! start (the table `__rt_rseq_table`). The exclusive monitor would catch a move between vCPUs
//! by itself in the run-queue pop; the rewind is what makes the plain loads before a commit
//! safe everywhere else.

use core::mem::{offset_of, size_of};

use activm_stub::arch::aarch64::percpu::PENDING_OFFSET;
use activm_stub::protocol::shared::{UpcallRecord, VcpuArea, UPCALL_QUEUE_CAPACITY};

use super::cpu::{offset, Word};
use crate::percpu::{Pcpu, RQ_CAP};
use crate::tcb::Tcb;

const _: () = assert!(RQ_CAP.is_power_of_two());
const _: () = assert!(size_of::<UpcallRecord>().is_multiple_of(8));
const _: () = assert!(UPCALL_QUEUE_CAPACITY.is_power_of_two());

core::arch::global_asm!(
    ".pushsection .text.activm_rt.rseq, \"ax\"",
    // fn __rt_rq_push(t: *const Tcb) -> bool
    ".globl __rt_rq_push",
    "__rt_rq_push:",
    "__rt_rseq_push_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr x9, [x9, #{pcpu}]",
    "    mov x12, #{tail}",
    "    add x12, x9, x12",
    "    ldr w10, [x12]",
    "    mov x13, #{head}",
    "    ldr w11, [x9, x13]",
    "    sub w13, w10, w11",
    "    cmp w13, #{cap}",
    "    b.hs 1f",
    "    and w13, w10, #{mask}",
    "    mov x14, #{ring}",
    "    add x14, x9, x14",
    "    str x0, [x14, x13, lsl #3]",
    "    add w10, w10, #1",
    "    stlr w10, [x12]",
    "__rt_rseq_push_end:",
    "    mov x0, #1",
    "    ret",
    "1:",
    "    mov x0, #0",
    "    ret",
    "",
    // fn __rt_rq_pop() -> *const Tcb (null if empty)
    ".globl __rt_rq_pop",
    "__rt_rq_pop:",
    "__rt_rseq_pop_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr x9, [x9, #{pcpu}]",
    "    mov x10, #{head}",
    "    add x10, x9, x10",
    "    ldaxr w11, [x10]",
    "    mov x12, #{tail}",
    "    ldr w12, [x9, x12]",
    "    cmp w11, w12",
    "    b.eq 1f",
    "    and w13, w11, #{mask}",
    "    mov x14, #{ring}",
    "    add x14, x9, x14",
    "    ldr x0, [x14, x13, lsl #3]",
    "    add w11, w11, #1",
    "    stlxr w15, w11, [x10]",
    "__rt_rseq_pop_end:",
    "    cbnz w15, __rt_rseq_pop_start",
    "    ret",
    "1:",
    "    clrex",
    "    mov x0, #0",
    "    ret",
    "",
    // fn __rt_take_record(dst: *mut UpcallRecord) -> bool: copy the record at this vCPU's queue
    // tail, then publish tail + 1.
    ".globl __rt_take_record",
    "__rt_take_record:",
    "__rt_rseq_take_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr x9, [x9, #{area}]",
    "    mov x10, #{qhead}",
    "    add x10, x9, x10",
    "    ldar w10, [x10]",
    "    mov x11, #{qtail}",
    "    add x11, x9, x11",
    "    ldr w12, [x11]",
    "    cmp w10, w12",
    "    b.eq 1f",
    "    and w13, w12, #{qmask}",
    "    mov x14, #{rec_size}",
    "    mul x13, x13, x14",
    "    mov x14, #{records}",
    "    add x13, x13, x14",
    "    add x13, x9, x13",
    "    mov x14, #{rec_words}",
    "    mov x15, x0",
    "2:  ldr x16, [x13], #8",
    "    str x16, [x15], #8",
    "    subs x14, x14, #1",
    "    b.ne 2b",
    "    add w12, w12, #1",
    "    stlr w12, [x11]",
    "__rt_rseq_take_end:",
    "    mov x0, #1",
    "    ret",
    "1:",
    "    mov x0, #0",
    "    ret",
    "",
    // fn __rt_idle_halt(): `wfi` unless this vCPU has deferred work.
    ".globl __rt_idle_halt",
    "__rt_idle_halt:",
    "__rt_rseq_halt_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr x10, [x9, #{pending}]",
    "    cbnz x10, 1f",
    "    wfi",
    "__rt_rseq_halt_end:",
    "1:",
    "    ret",
    "",
    // fn __rt_probe_increment(spins: u64): this vCPU's probe counter += 1, with a long body.
    ".globl __rt_probe_increment",
    "__rt_probe_increment:",
    "__rt_rseq_probe_start:",
    "    mrs x9, tpidrro_el0",
    "    ldr x9, [x9, #{pcpu}]",
    "    mov x12, #{probe}",
    "    add x9, x9, x12",
    "    ldr x10, [x9]",
    "    mov x11, x0",
    "2:  yield",
    "    subs x11, x11, #1",
    "    b.ne 2b",
    "    add x10, x10, #1",
    "    str x10, [x9]",
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
);

extern "C" {
    fn __rt_rq_push(t: *const u8) -> bool;
    fn __rt_rq_pop() -> *const u8;
    fn __rt_take_record(dst: *mut UpcallRecord) -> bool;
    fn __rt_idle_halt();
    fn __rt_probe_increment(spins: u64);
    static __rt_rseq_table: [RseqEntry; 0];
    static __rt_rseq_table_end: [RseqEntry; 0];
}

/// One registered sequence.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RseqEntry {
    start: u64,
    end: u64,
    abort: u64,
}

fn table() -> &'static [RseqEntry] {
    let start = core::ptr::addr_of!(__rt_rseq_table) as *const RseqEntry;
    let end = core::ptr::addr_of!(__rt_rseq_table_end) as *const RseqEntry;
    // SAFETY: the assembly above emits the entries contiguously between the two labels.
    unsafe { core::slice::from_raw_parts(start, end.offset_from(start) as usize) }
}

/// If `rip` is inside a restartable sequence (not yet committed), the address to continue at
/// instead.
#[inline]
pub fn fixup(rip: u64) -> Option<u64> {
    table()
        .iter()
        .find(|e| e.start <= rip && rip < e.end)
        .map(|e| e.abort)
}

/// Pushes `t` on this vCPU's run queue; false if the ring is full.
///
/// # Safety
/// `t` is a live TCB that is runnable and in no queue; the runtime's per-vCPU word is set.
#[inline(always)]
pub unsafe fn rq_push(t: *const Tcb) -> bool {
    // SAFETY: the caller guarantees `t`; the sequence only touches this vCPU's ring.
    unsafe { __rt_rq_push(t as *const u8) }
}

/// Pops the oldest thread of this vCPU's run queue (null if empty).
#[inline(always)]
pub fn rq_pop() -> *const Tcb {
    // SAFETY: the sequence only touches this vCPU's ring, set up before any thread runs.
    unsafe { __rt_rq_pop() as *const Tcb }
}

/// Takes the next record of this vCPU's upcall queue into `dst`; false if it is empty.
#[inline]
pub fn take_record(dst: &mut UpcallRecord) -> bool {
    // SAFETY: `dst` is a whole record; the sequence reads this vCPU's queue in the shared area.
    unsafe { __rt_take_record(dst) }
}

/// Sleeps (`wfi` at EL0: KVM blocks the vCPU, no exit) until an interrupt, unless work is
/// already pending.
#[inline]
pub fn idle_halt() {
    // SAFETY: the sequence reads this vCPU's pending word and waits; it clobbers only
    // caller-saved registers, as the C ABI allows.
    unsafe { __rt_idle_halt() }
}

/// Adds one to this vCPU's probe counter with a body of `spins` `yield`s (for tests).
#[inline(never)]
pub fn probe_increment(spins: u64) {
    // SAFETY: only this vCPU's probe counter is written.
    unsafe { __rt_probe_increment(spins.max(1)) }
}
