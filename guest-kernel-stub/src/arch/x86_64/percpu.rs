//! The per-vCPU block, reached through `%gs` without leaving CPL3. `_start` (CPL0) points
//! IA32_GS_BASE at `CPU_LOCAL[vcpu]`; the CPL3 entry fills the block and checks `%gs:0`.

use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use protocol::MAX_VCPUS;

/// One vCPU's block: one cache line, so `_start` indexes the array with a shift.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct CpuLocal {
    /// This block's address (`%gs:0`).
    this: AtomicU64,
    /// The vCPU index (`%gs:8`).
    vcpu: AtomicU32,
    /// Set while this vCPU formats a panic message.
    panicking: AtomicBool,
    /// Free for the layer above (the runtime's per-vCPU pointer), at `%gs:USER_OFFSET`.
    user: AtomicU64,
}

/// `%gs` offset of [`CpuLocal`]'s field for the layer above.
pub const USER_OFFSET: usize = offset_of!(CpuLocal, user);

/// log2 of `size_of::<CpuLocal>()`, for `_start`.
pub(crate) const CPU_LOCAL_SHIFT: u32 = core::mem::size_of::<CpuLocal>().trailing_zeros();

const _: () = assert!(1 << CPU_LOCAL_SHIFT == core::mem::size_of::<CpuLocal>());

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: CpuLocal = CpuLocal {
    this: AtomicU64::new(0),
    vcpu: AtomicU32::new(0),
    panicking: AtomicBool::new(false),
    user: AtomicU64::new(0),
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
}

/// Fills `CPU_LOCAL[vcpu]` and checks that `%gs` points at it. Returns false if it does not.
pub(crate) fn init(vcpu: usize) -> bool {
    let block = &CPU_LOCAL[vcpu];
    let addr = block as *const CpuLocal as u64;
    block.this.store(addr, Ordering::Relaxed);
    block.vcpu.store(vcpu as u32, Ordering::Relaxed);
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
            off = const offset_of!(CpuLocal, this),
            options(nostack, readonly, preserves_flags),
        );
    }
    this
}

/// This vCPU's block.
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
            off = const offset_of!(CpuLocal, vcpu),
            options(nostack, readonly, preserves_flags),
        );
    }
    vcpu
}

/// Stores a word for the layer above in this vCPU's block.
pub fn set_user(value: u64) {
    this_cpu().user.store(value, Ordering::Relaxed);
}
