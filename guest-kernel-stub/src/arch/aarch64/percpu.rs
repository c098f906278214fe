//! The per-vCPU block, reached through TPIDRRO_EL0 (EL0 reads it, only EL1 writes it): `_start`
//! points it at `CPU_LOCAL[vcpu]`, the EL0 entry fills the block and checks it.
//!
//! A thread may be interrupted and moved to another vCPU between any two instructions. The
//! read-modify-write helpers below therefore re-read TPIDRRO_EL0 inside their exclusive-access
//! loop: an interrupt between the read and the `stxr` ends in an exception return, which clears
//! the exclusive monitor, so the `stxr` fails and the loop retries with the new vCPU's block.

use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use protocol::MAX_VCPUS;

/// Words of the block owned by the layer above.
pub const RT_WORDS: usize = 8;

/// One vCPU's block: two cache lines, so `_start` indexes the array with a shift.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CpuLocal {
    /// This block's address.
    this: AtomicU64,
    /// The vCPU index.
    vcpu: AtomicU32,
    /// Set while this vCPU formats a panic message.
    panicking: AtomicBool,
    /// Free for the layer above.
    user: AtomicU64,
    /// Preemption holds (held spinlocks) of the code running on this vCPU (`crate::preempt`).
    hold: AtomicU64,
    /// Work the layer above deferred while `hold` was non-zero; see `crate::preempt`.
    pending: AtomicU64,
    /// Words owned by the layer above.
    rt: [AtomicU64; RT_WORDS],
}

/// Offset of the preemption-hold counter.
pub const HOLD_OFFSET: usize = offset_of!(CpuLocal, hold);
/// Offset of the pending-work word.
pub const PENDING_OFFSET: usize = offset_of!(CpuLocal, pending);
/// Offset of the first word owned by the layer above.
pub const RT_OFFSET: usize = offset_of!(CpuLocal, rt);

/// log2 of `size_of::<CpuLocal>()`, for `_start`.
pub(crate) const CPU_LOCAL_SHIFT: u32 = core::mem::size_of::<CpuLocal>().trailing_zeros();

const _: () = assert!(1 << CPU_LOCAL_SHIFT == core::mem::size_of::<CpuLocal>());

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: CpuLocal = CpuLocal {
    this: AtomicU64::new(0),
    vcpu: AtomicU32::new(0),
    panicking: AtomicBool::new(false),
    user: AtomicU64::new(0),
    hold: AtomicU64::new(0),
    pending: AtomicU64::new(0),
    rt: [const { AtomicU64::new(0) }; RT_WORDS],
};

/// One block per possible vCPU; `_start` uses its address.
pub(crate) static CPU_LOCAL: [CpuLocal; MAX_VCPUS] = [EMPTY; MAX_VCPUS];

impl CpuLocal {
    /// Marks this vCPU as panicking; returns whether it already was.
    pub(crate) fn enter_panic(&self) -> bool {
        self.panicking.swap(true, Ordering::Relaxed)
    }

    /// The value the layer above stored with [`set_user`].
    pub fn user(&self) -> u64 {
        self.user.load(Ordering::Relaxed)
    }

    /// The vCPU this block belongs to.
    pub fn vcpu(&self) -> u32 {
        self.vcpu.load(Ordering::Relaxed)
    }

    /// The preemption-hold counter (see `crate::preempt`).
    pub fn hold(&self) -> &AtomicU64 {
        &self.hold
    }

    /// The pending-work word (see `crate::preempt`).
    pub fn pending(&self) -> &AtomicU64 {
        &self.pending
    }

    /// Word `i` of the layer above's area.
    pub fn rt_word(&self, i: usize) -> &AtomicU64 {
        &self.rt[i]
    }
}

/// vCPU `vcpu`'s block.
pub fn cpu_local(vcpu: usize) -> &'static CpuLocal {
    &CPU_LOCAL[vcpu]
}

/// Fills `CPU_LOCAL[vcpu]` and checks that TPIDRRO_EL0 points at it.
pub(crate) fn init(vcpu: usize) -> bool {
    let block = &CPU_LOCAL[vcpu];
    let addr = block as *const CpuLocal as u64;
    block.this.store(addr, Ordering::Relaxed);
    block.vcpu.store(vcpu as u32, Ordering::Relaxed);
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
    this_cpu().vcpu.load(Ordering::Relaxed)
}

/// Stores a word for the layer above in this vCPU's block.
pub fn set_user(value: u64) {
    this_cpu().user.store(value, Ordering::Relaxed);
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

/// Atomically adds `delta` to the field at `offset` of *this* vCPU's block; returns the new value.
///
/// # Safety
/// As [`local_read`]; the field is one the caller may write.
#[inline(always)]
pub unsafe fn local_add(offset: usize, delta: u64) -> u64 {
    let new: u64;
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "2:",
            "mrs {p}, tpidrro_el0",
            "add {p}, {p}, {off}",
            "ldxr {v}, [{p}]",
            "add {v}, {v}, {d}",
            "stxr {f:w}, {v}, [{p}]",
            "cbnz {f:w}, 2b",
            p = out(reg) _,
            v = out(reg) new,
            f = out(reg) _,
            off = in(reg) offset,
            d = in(reg) delta,
            options(nostack),
        );
    }
    new
}

/// Atomically ors `bits` into the field at `offset` of *this* vCPU's block.
///
/// # Safety
/// As [`local_add`].
#[inline(always)]
pub unsafe fn local_or(offset: usize, bits: u64) {
    // SAFETY: the caller passes the offset of a writable field of this vCPU's block.
    unsafe {
        core::arch::asm!(
            "2:",
            "mrs {p}, tpidrro_el0",
            "add {p}, {p}, {off}",
            "ldxr {v}, [{p}]",
            "orr {v}, {v}, {b}",
            "stxr {f:w}, {v}, [{p}]",
            "cbnz {f:w}, 2b",
            p = out(reg) _,
            v = out(reg) _,
            f = out(reg) _,
            off = in(reg) offset,
            b = in(reg) bits,
            options(nostack),
        );
    }
}

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
