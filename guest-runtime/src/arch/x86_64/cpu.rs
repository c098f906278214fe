//! This vCPU's words in the stub's `%gs` block, the TSC, the local APIC timer and IPIs.
//!
//! The runtime keeps its per-vCPU scheduling state in the words the stub reserves for it
//! (`activm_stub::arch::x86_64::percpu::RT_OFFSET`), so one instruction reads or changes *this*
//! vCPU's copy even in code that may be preempted and continued on another vCPU.

use activm_stub::arch::x86_64::percpu::{self, RT_OFFSET};
use activm_stub::protocol::arch::x86_64::TIMER_IRQ;

pub use crate::arch::word::Word;

/// `%gs` offset of `word` (for assembly).
pub const fn offset(word: Word) -> usize {
    RT_OFFSET + 8 * word as usize
}

/// Reads `word` of this vCPU in one instruction.
#[inline(always)]
pub fn get(word: Word) -> u64 {
    // SAFETY: the offset is that of a runtime word of the stub's per-vCPU block.
    unsafe { percpu::gs_read(offset(word)) }
}

/// Writes `word` of this vCPU in one instruction.
#[inline(always)]
pub fn set(word: Word, value: u64) {
    // SAFETY: the offset is that of a runtime word of the stub's per-vCPU block.
    unsafe { percpu::gs_write(offset(word), value) }
}

/// Reads `word` of vCPU `vcpu` (which must not be running, or the value is a snapshot).
pub fn get_of(vcpu: u32, word: Word) -> u64 {
    percpu::cpu_local(vcpu as usize)
        .rt_word(word as usize)
        .load(core::sync::atomic::Ordering::Acquire)
}

/// Writes `word` of vCPU `vcpu` (which must not be running).
pub fn set_of(vcpu: u32, word: Word, value: u64) {
    percpu::cpu_local(vcpu as usize)
        .rt_word(word as usize)
        .store(value, core::sync::atomic::Ordering::Release)
}

/// The stub's pending-work word of this vCPU: swaps in 0, returns what was pending.
#[inline(always)]
pub fn take_pending() -> u64 {
    // SAFETY: the stub's pending word; one atomic instruction.
    unsafe { percpu::gs_swap(percpu::PENDING_OFFSET, 0) }
}

/// The stub's pending-work word of this vCPU.
#[inline(always)]
pub fn pending() -> u64 {
    // SAFETY: the stub's pending word.
    unsafe { percpu::gs_read(percpu::PENDING_OFFSET) }
}

/// Sets this vCPU's preemption-hold count (used when a lock holder's count moves with it).
#[inline(always)]
pub fn set_hold(count: u64) {
    // SAFETY: the stub's hold counter of this vCPU.
    unsafe { percpu::gs_write(percpu::HOLD_OFFSET, count) }
}

/// The hold count of vCPU `vcpu` (not running: a snapshot of its last activation).
pub fn hold_of(vcpu: u32) -> u64 {
    percpu::cpu_local(vcpu as usize)
        .hold()
        .load(core::sync::atomic::Ordering::Acquire)
}

/// The time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    activm_stub::rdtsc()
}

/// The runtime's private vector for its simulated VMM (`upcall::sim`).
pub const SIM_IRQ: u8 = 0x41;

/// Programs this vCPU's APIC timer for one-shot interrupts on the runtime's timer vector.
pub fn init_timer() {
    activm_stub::lapic::setup_oneshot_timer(TIMER_IRQ);
}

/// Whether this vCPU's timer is known not to run: never said here (reading the APIC costs an
/// exit; `Word::Armed` is trusted).
#[inline]
pub fn timer_stopped() -> bool {
    false
}

/// Arms this vCPU's one-shot timer to fire `ns` nanoseconds from now (KVM's APIC timer ticks
/// at 1 GHz). One APIC write: ~6.5 us on our hosts, so callers arm once per time slice.
#[inline]
pub fn arm_timer_ns(ns: u64) {
    let count = ns.clamp(1, u64::from(u32::MAX)) as u32;
    activm_stub::lapic::set_timer_count(count);
}

/// Sends `vector` to the vCPU with APIC id `apic_id` (two APIC writes, ~13 us).
pub fn send_ipi(apic_id: u32, vector: u8) {
    activm_stub::lapic::send_ipi(apic_id, vector);
}

/// Sends `vector` to this vCPU.
pub fn send_self_ipi(vector: u8) {
    activm_stub::lapic::send_self_ipi(vector);
}

/// Ends the in-service interrupts among `vectors` that a previous activation of this vCPU may
/// have left without their EOI.
pub fn end_owed_interrupts(vectors: &[u8]) {
    activm_stub::lapic::clear_in_service(vectors);
}

/// The runtime word `word` of vCPU `vcpu`, as an atomic (for compare-and-swap from elsewhere).
pub fn word_of(vcpu: u32, word: Word) -> &'static core::sync::atomic::AtomicU64 {
    percpu::cpu_local(vcpu as usize).rt_word(word as usize)
}

/// vCPU `vcpu`'s pending word (diagnostics).
pub fn pending_of(vcpu: u32) -> u64 {
    percpu::cpu_local(vcpu as usize)
        .pending()
        .load(core::sync::atomic::Ordering::Acquire)
}

/// Prints this vCPU's interrupt controller state for the runtime's vectors (diagnostics).
pub fn print_interrupt_state() {
    use activm_stub::protocol::arch::x86_64::{RESCHEDULE_IRQ, UPCALL_IRQ};
    let state = |v: u8| activm_stub::lapic::vector_state(v);
    activm_stub::println!(
        "activm-rt: this vCPU ({}) APIC: timer count {} in-service/requested timer {:?} resched {:?} upcall {:?}",
        activm_stub::vcpu_id(),
        activm_stub::lapic::timer_count(),
        state(TIMER_IRQ),
        state(RESCHEDULE_IRQ),
        state(UPCALL_IRQ),
    );
}

/// Compares `word` with `old` and, if equal, stores `new`: `cmpxchg` **without** the `lock`
/// prefix, a third of a locked one's cost. One instruction, so atomic against this vCPU's
/// interrupts and preemption, but not against another vCPU: only for a guest with one vCPU. A
/// compiler barrier on both sides (the assembly may touch any memory).
#[inline(always)]
pub fn cas_one_vcpu(word: &core::sync::atomic::AtomicU32, old: u32, new: u32) -> bool {
    let seen: u32;
    // SAFETY: `word` is a live, aligned `u32`; `cmpxchg` reads and writes only it, `eax` and
    // the flags. No other vCPU exists to race with (the caller's contract).
    unsafe {
        core::arch::asm!(
            "cmpxchg dword ptr [{word}], {new:e}",
            word = in(reg) word.as_ptr(),
            new = in(reg) new,
            inout("eax") old => seen,
            options(nostack),
        );
    }
    seen == old
}
