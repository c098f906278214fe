//! The per-vCPU block, reached through `%gs` without leaving CPL3. `_start` (CPL0) points
//! IA32_GS_BASE at `CPU_LOCAL[vcpu]`; the CPL3 entry fills the block and checks `%gs:0`.
//!
//! Every field sits at a fixed `%gs` offset, so a single instruction (`incq %gs:HOLD_OFFSET`,
//! `xchg %rax, %gs:PENDING_OFFSET`) reads or changes *this* vCPU's copy: a CPL3 thread that can be
//! interrupted and moved to another vCPU between two instructions never mixes two vCPUs' fields
//! inside one instruction. The layer above (the thread runtime) owns [`RT_WORDS`] words at
//! [`RT_OFFSET`].

use core::sync::atomic::Ordering;

pub use crate::cpu_local::*;

/// Fills `CPU_LOCAL[vcpu]` and checks that `%gs` points at it. Returns false if it does not.
pub(crate) fn init(vcpu: usize) -> bool {
    let addr = fill(vcpu);
    gs_self() == addr
}

/// `%gs:0`: the address of this vCPU's block.
#[inline(always)]
fn gs_self() -> u64 {
    let this: u64;
    // SAFETY: reads this vCPU's block through %gs, set by `_start`.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr gs:[{off}]",
            out(reg) this,
            off = const THIS_OFFSET,
            options(nostack, readonly, preserves_flags),
        );
    }
    this
}

/// This vCPU's block. Code that can be preempted and moved to another vCPU must not keep the
/// reference across a preemption point.
#[inline(always)]
pub fn this_cpu() -> &'static CpuLocal {
    // SAFETY: %gs:0 holds the address of an element of the static `CPU_LOCAL` (checked at boot).
    unsafe { &*(gs_self() as *const CpuLocal) }
}

/// The index of the vCPU running this code, read through `%gs` (no exit).
#[inline(always)]
pub fn vcpu_id() -> u32 {
    let vcpu: u32;
    // SAFETY: reads this vCPU's block through %gs, set by `_start`.
    unsafe {
        core::arch::asm!(
            "mov {:e}, dword ptr gs:[{off}]",
            out(reg) vcpu,
            off = const VCPU_OFFSET,
            options(nostack, readonly, preserves_flags),
        );
    }
    vcpu
}

/// Stores a word for the layer above in this vCPU's block.
pub fn set_user(value: u64) {
    this_cpu().user_field().store(value, Ordering::Relaxed);
}

/// Reads `%gs:offset` (a 64-bit field of this vCPU's block) in one instruction.
///
/// # Safety
/// `offset` is the offset of an 8-byte-aligned 64-bit field of [`CpuLocal`].
#[inline(always)]
pub unsafe fn gs_read(offset: usize) -> u64 {
    let value: u64;
    // SAFETY: the caller passes the offset of a field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr gs:[{off}]",
            out(reg) value,
            off = in(reg) offset,
            options(nostack, readonly, preserves_flags),
        );
    }
    value
}

/// Writes `%gs:offset` in one instruction.
///
/// # Safety
/// As [`gs_read`]; the field is one the caller may write.
#[inline(always)]
pub unsafe fn gs_write(offset: usize, value: u64) {
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "mov qword ptr gs:[{off}], {}",
            in(reg) value,
            off = in(reg) offset,
            options(nostack, preserves_flags),
        );
    }
}

/// Exchanges `%gs:offset` with `value` in one (atomic) instruction; returns the old value.
///
/// # Safety
/// As [`gs_write`].
#[inline(always)]
pub unsafe fn gs_swap(offset: usize, value: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "xchg qword ptr gs:[{off}], {v}",
            v = inout(reg) value => old,
            off = in(reg) offset,
            options(nostack, preserves_flags),
        );
    }
    old
}

/// `lock or` of `bits` into `%gs:offset` in one instruction.
///
/// # Safety
/// As [`gs_write`].
#[inline(always)]
pub unsafe fn gs_or(offset: usize, bits: u64) {
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "lock or qword ptr gs:[{off}], {v}",
            v = in(reg) bits,
            off = in(reg) offset,
            options(nostack),
        );
    }
}

/// Adds one to this vCPU's preemption hold count, in one instruction (so a thread that
/// migrates never changes another vCPU's count).
#[inline(always)]
pub fn hold_enter() {
    // SAFETY: one instruction on this vCPU's hold counter.
    unsafe {
        core::arch::asm!(
            "inc qword ptr gs:[{off}]",
            off = const HOLD_OFFSET,
            options(nostack),
        );
    }
}

/// Takes one from this vCPU's preemption hold count, in one instruction; returns whether it
/// reached zero.
#[inline(always)]
pub fn hold_leave() -> bool {
    let zero: u8;
    // SAFETY: one instruction on this vCPU's hold counter.
    unsafe {
        core::arch::asm!(
            "dec qword ptr gs:[{off}]",
            "setz {z}",
            off = const HOLD_OFFSET,
            z = out(reg_byte) zero,
            options(nostack),
        );
    }
    zero != 0
}
