//! The Rust side of the restartable sequences, the same on every architecture: each
//! architecture's `rseq.rs` emits the `__rt_*` sequences and their table in assembly, and
//! re-exports these wrappers.

use activm_stub::protocol::shared::UpcallRecord;

use crate::tcb::Tcb;

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

/// If `pc` is inside a restartable sequence (not yet committed), the address to continue at
/// instead.
#[inline]
pub fn fixup(pc: u64) -> Option<u64> {
    table()
        .iter()
        .find(|e| e.start <= pc && pc < e.end)
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

/// Sleeps until an interrupt, unless work is already pending (x86_64: the `halt` hypercall;
/// aarch64: `wfi` at EL0, which KVM blocks without an exit).
#[inline]
pub fn idle_halt() {
    // SAFETY: the sequence reads this vCPU's pending word and waits; it clobbers only
    // caller-saved registers, as its C ABI declaration allows.
    unsafe { __rt_idle_halt() }
}

/// Adds one to this vCPU's probe counter with a body of `spins` spin-loop hints (for tests).
#[inline(never)]
pub fn probe_increment(spins: u64) {
    // SAFETY: only this vCPU's probe counter is written.
    unsafe { __rt_probe_increment(spins.max(1)) }
}
