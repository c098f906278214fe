//! This vCPU's words in the stub's per-vCPU block (TPIDRRO_EL0), the virtual counter, the
//! virtual timer and SGIs.
//!
//! The runtime keeps its per-vCPU scheduling state in the words the stub reserves for it
//! (`activm_stub::arch::aarch64::percpu::RT_OFFSET`). Reading one takes two instructions (`mrs`
//! of the base, then `ldr`): a thread moved to another vCPU in between reads the old vCPU's
//! word, a snapshot, as on x86_64 after the read. Writes are made migration-safe with an
//! exclusive pair that re-reads the base (an exception return clears the monitor, so a store
//! after a move fails and is retried on the new vCPU's block).

use activm_stub::arch::aarch64::irqchip;
use activm_stub::arch::aarch64::percpu::{self, HOLD_OFFSET, PENDING_OFFSET, RT_OFFSET};
use activm_stub::protocol::arch::aarch64::UPCALL_IRQ;
use core::sync::atomic::{AtomicU64, Ordering};

pub use crate::arch::word::Word;

/// Offset of `word` in the per-vCPU block (for assembly).
pub const fn offset(word: Word) -> usize {
    RT_OFFSET + 8 * word as usize
}

/// Reads `word` of this vCPU.
#[inline(always)]
pub fn get(word: Word) -> u64 {
    // SAFETY: the offset is that of a runtime word of the stub's per-vCPU block.
    unsafe { percpu::local_read(offset(word)) }
}

/// Swaps `value` into the field at `offset` of *this* vCPU's block; returns the old value.
///
/// # Safety
/// `offset` is that of a writable 8-byte field of the block.
#[inline(always)]
unsafe fn local_swap(offset: usize, value: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller passes a field of this vCPU's block; the exclusive pair retries from
    // the base read if the thread moved (see the module documentation).
    unsafe {
        core::arch::asm!(
            "2:",
            "mrs {p}, tpidrro_el0",
            "add {p}, {p}, {off}",
            "ldxr {o}, [{p}]",
            "stxr {f:w}, {v}, [{p}]",
            "cbnz {f:w}, 2b",
            p = out(reg) _,
            o = out(reg) old,
            f = out(reg) _,
            off = in(reg) offset,
            v = in(reg) value,
            options(nostack),
        );
    }
    old
}

/// Writes `word` of this vCPU.
#[inline(always)]
pub fn set(word: Word, value: u64) {
    // SAFETY: the offset is that of a runtime word of the stub's per-vCPU block.
    unsafe { local_swap(offset(word), value) };
}

/// Reads `word` of vCPU `vcpu` (which must not be running, or the value is a snapshot).
pub fn get_of(vcpu: u32, word: Word) -> u64 {
    word_of(vcpu, word).load(Ordering::Acquire)
}

/// Writes `word` of vCPU `vcpu` (which must not be running).
pub fn set_of(vcpu: u32, word: Word, value: u64) {
    word_of(vcpu, word).store(value, Ordering::Release)
}

/// The stub's pending-work word of this vCPU: swaps in 0, returns what was pending.
#[inline(always)]
pub fn take_pending() -> u64 {
    // SAFETY: the stub's pending word.
    unsafe { local_swap(PENDING_OFFSET, 0) }
}

/// The stub's pending-work word of this vCPU.
#[inline(always)]
pub fn pending() -> u64 {
    // SAFETY: the stub's pending word.
    unsafe { percpu::local_read(PENDING_OFFSET) }
}

/// Sets this vCPU's preemption-hold count (used when a lock holder's count moves with it).
#[inline(always)]
pub fn set_hold(count: u64) {
    // SAFETY: the stub's hold counter of this vCPU.
    unsafe { local_swap(HOLD_OFFSET, count) };
}

/// The hold count of vCPU `vcpu` (not running: a snapshot of its last activation).
pub fn hold_of(vcpu: u32) -> u64 {
    percpu::cpu_local(vcpu as usize)
        .hold()
        .load(Ordering::Acquire)
}

/// The virtual counter (CNTVCT_EL0), the runtime's time stamp (`tsc_khz` is its frequency).
#[inline(always)]
pub fn rdtsc() -> u64 {
    activm_stub::rdtsc()
}

/// The runtime's own SGI for its simulated VMM (`upcall::sim`).
pub const SIM_IRQ: u8 = 10;

/// Stops the virtual timer (it is enabled each time it is armed) and enables the simulated
/// VMM's SGI on this vCPU (the stub enables only the protocol's interrupts).
pub fn init_timer() {
    irqchip::stop_timer();
    irqchip::enable_sgi(u32::from(SIM_IRQ));
}

/// The shortest timer armed: a handler that re-arms the timer and then outlasts it (as under
/// QEMU's emulation, for the runtime's 30 us random preemptions) is interrupted again in the
/// trampoline's epilogue, one interrupt frame deeper each time, until the stack overflows.
const MIN_TIMER_NS: u64 = 200_000;

/// Arms this vCPU's virtual timer to fire `ns` (at least [`MIN_TIMER_NS`]) nanoseconds from
/// now (two EL0 system-register writes, no exit).
#[inline]
pub fn arm_timer_ns(ns: u64) {
    let khz = crate::percpu::tsc_khz();
    let ns = ns.max(MIN_TIMER_NS);
    let ticks = (u128::from(ns) * u128::from(khz) / 1_000_000) as u64;
    irqchip::arm_timer_ticks(ticks.max(1));
}

/// Whether this vCPU's virtual timer cannot fire: disabled, or masked (as the EL1 stub leaves
/// it when it fires). One EL0 system-register read, no exit.
#[inline]
pub fn timer_stopped() -> bool {
    let ctl: u64;
    // SAFETY: reading CNTV_CTL_EL0 (EL0-accessible: CNTKCTL_EL1.EL0VTEN) has no side effects.
    unsafe { core::arch::asm!("mrs {}, cntv_ctl_el0", out(reg) ctl, options(nomem, nostack)) };
    ctl & 0b11 != 0b01
}

/// Sends `intid` to the vCPU whose interrupt id (its index) is `irq_id`: an SGI (`svc #1`),
/// or, for `UPCALL_IRQ` (the simulated VMM's upcalls), that vCPU's upcall SPI made pending.
pub fn send_ipi(irq_id: u32, intid: u8) {
    if intid == UPCALL_IRQ {
        irqchip::raise_upcall(irq_id);
    } else {
        irqchip::send_sgi(irq_id, u32::from(intid));
    }
}

/// Sends `intid` to this vCPU (as [`send_ipi`]).
pub fn send_self_ipi(intid: u8) {
    send_ipi(activm_stub::vcpu_id(), intid);
}

/// Nothing is ever owed: the stub's EL1 entry EOIs every interrupt before EL0 sees it.
pub fn end_owed_interrupts(_intids: &[u8]) {}

/// The runtime word `word` of vCPU `vcpu`, as an atomic (for compare-and-swap from elsewhere).
pub fn word_of(vcpu: u32, word: Word) -> &'static AtomicU64 {
    percpu::cpu_local(vcpu as usize).rt_word(word as usize)
}

/// vCPU `vcpu`'s pending word (diagnostics).
pub fn pending_of(vcpu: u32) -> u64 {
    percpu::cpu_local(vcpu as usize)
        .pending()
        .load(Ordering::Acquire)
}

/// Prints this vCPU's timer state (diagnostics; the GIC's active state is not readable at EL0).
pub fn print_interrupt_state() {
    let ctl: u64;
    // SAFETY: reading CNTV_CTL_EL0 (EL0-accessible) has no side effects.
    unsafe { core::arch::asm!("mrs {}, cntv_ctl_el0", out(reg) ctl, options(nomem, nostack)) };
    activm_stub::println!(
        "activm-rt: this vCPU ({}) virtual timer CNTV_CTL {:#x} (bit 0 enable, 1 mask, 2 status)",
        activm_stub::vcpu_id(),
        ctl,
    );
}

/// Compares `word` with `old` and, if equal, stores `new`, with no ordering against other
/// vCPUs (a relaxed read-modify-write: still atomic against this vCPU's interrupts and
/// preemption, as an exception return clears the exclusive monitor): only for a guest with one
/// vCPU. A compiler barrier on both sides.
#[inline(always)]
pub fn cas_one_vcpu(word: &core::sync::atomic::AtomicU32, old: u32, new: u32) -> bool {
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    let done = word
        .compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok();
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    done
}
