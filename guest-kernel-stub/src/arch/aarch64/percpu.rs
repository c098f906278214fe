//! The per-vCPU block, reached through TPIDRRO_EL0 (EL0 reads it, only EL1 writes it): `_start`
//! points it at `CPU_LOCAL[vcpu]`, the EL0 entry fills the block and checks it.
//!
//! A thread may be interrupted and moved to another vCPU between any two instructions. The
//! read-modify-write helpers below therefore re-read TPIDRRO_EL0 inside their exclusive-access
//! loop: an interrupt between the read and the `stxr` ends in an exception return, which clears
//! the exclusive monitor, so the `stxr` fails and the loop retries with the new vCPU's block.

use core::sync::atomic::Ordering;

pub use crate::cpu_local::*;

/// Fills `CPU_LOCAL[vcpu]` and checks that TPIDRRO_EL0 points at it.
pub(crate) fn init(vcpu: usize) -> bool {
    let addr = fill(vcpu);
    base() == addr
}

/// TPIDRRO_EL0: the address of this vCPU's block.
#[inline(always)]
fn base() -> u64 {
    let this: u64;
    // SAFETY: reading TPIDRRO_EL0 has no side effects.
    unsafe {
        core::arch::asm!("mrs {}, tpidrro_el0", out(reg) this, options(nomem, nostack, preserves_flags));
    }
    this
}

/// This vCPU's block. Code that can be preempted and moved to another vCPU must not keep the
/// reference across a preemption point.
#[inline(always)]
pub fn this_cpu() -> &'static CpuLocal {
    // SAFETY: TPIDRRO_EL0 holds the address of an element of `CPU_LOCAL` (checked at boot).
    unsafe { &*(base() as *const CpuLocal) }
}

/// The index of the vCPU running this code (one `mrs` and one load; a thread moved between the
/// two still gets the index of a vCPU it ran on).
#[inline(always)]
pub fn vcpu_id() -> u32 {
    this_cpu().vcpu()
}

/// The index of the vCPU running this code, from TPIDRRO_EL0 itself (which `_start` sets at EL1
/// before any EL0 code runs) rather than from the block's contents, which the EL0 entry fills:
/// right for a vCPU whose boot context never got that far.
#[inline(always)]
pub fn vcpu_index_of_register() -> u32 {
    ((base() - CPU_LOCAL.as_ptr() as u64) >> CPU_LOCAL_SHIFT) as u32
}

/// Stores a word for the layer above in this vCPU's block.
pub fn set_user(value: u64) {
    this_cpu().user_field().store(value, Ordering::Relaxed);
}

/// Reads the 64-bit field at `offset` of this vCPU's block (re-reading the base if the thread
/// moved vCPUs in between, see the module documentation).
///
/// # Safety
/// `offset` is the offset of an 8-byte-aligned 64-bit field of [`CpuLocal`].
#[inline(always)]
pub unsafe fn local_read(offset: usize) -> u64 {
    let value: u64;
    // SAFETY: the caller passes the offset of a field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidrro_el0",
            "ldr {v}, [{p}, {off}]",
            p = out(reg) _,
            v = out(reg) value,
            off = in(reg) offset,
            options(nostack, readonly, preserves_flags),
        );
    }
    value
}

/// Stores `value` in the field at `offset` of *this* vCPU's block (an exclusive pair, so a
/// thread moved to another vCPU between the base read and the store retries, see the module
/// documentation).
///
/// # Safety
/// `offset` is the offset of an 8-byte-aligned 64-bit field of [`CpuLocal`] the caller may
/// write.
#[inline(always)]
pub unsafe fn local_write(offset: usize, value: u64) {
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "2:",
            "mrs {p}, tpidrro_el0",
            "add {p}, {p}, {off}",
            "ldxr xzr, [{p}]",
            "stxr {f:w}, {v}, [{p}]",
            "cbnz {f:w}, 2b",
            p = out(reg) _,
            f = out(reg) _,
            off = in(reg) offset,
            v = in(reg) value,
            options(nostack),
        );
    }
}

/// One read-modify-write of the field at `offset` of *this* vCPU's block with the instruction
/// `op` (`add`/`orr`), retried from the base register read if the thread moved (see the module
/// documentation); evaluates to the new value.
macro_rules! local_rmw {
    ($op:literal, $offset:expr, $operand:expr) => {{
        let new: u64;
        // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
        unsafe {
            core::arch::asm!(
                "2:",
                "mrs {p}, tpidrro_el0",
                "add {p}, {p}, {off}",
                "ldxr {v}, [{p}]",
                concat!($op, " {v}, {v}, {x}"),
                "stxr {f:w}, {v}, [{p}]",
                "cbnz {f:w}, 2b",
                p = out(reg) _,
                v = out(reg) new,
                f = out(reg) _,
                off = in(reg) $offset,
                x = in(reg) $operand,
                options(nostack),
            );
        }
        new
    }};
}

/// Atomically adds `delta` to the field at `offset` of *this* vCPU's block; returns the new value.
///
/// # Safety
/// As [`local_read`]; the field is one the caller may write.
#[inline(always)]
pub unsafe fn local_add(offset: usize, delta: u64) -> u64 {
    local_rmw!("add", offset, delta)
}

/// Atomically ors `bits` into the field at `offset` of *this* vCPU's block.
///
/// # Safety
/// As [`local_add`].
#[inline(always)]
pub unsafe fn local_or(offset: usize, bits: u64) {
    local_rmw!("orr", offset, bits);
}

/// The names the shared code (`crate::preempt`) uses on both architectures.
pub use local_or as gs_or;
pub use local_read as gs_read;

/// Enters a preemption hold on this vCPU (see `crate::preempt`).
#[inline(always)]
pub fn hold_enter() {
    // SAFETY: the hold counter is a writable field of the block.
    unsafe { local_add(HOLD_OFFSET, 1) };
}

/// Leaves a preemption hold; true if this vCPU's count is now zero.
#[inline(always)]
pub fn hold_leave() -> bool {
    // SAFETY: as `hold_enter`.
    unsafe { local_add(HOLD_OFFSET, u64::MAX) == 0 }
}
