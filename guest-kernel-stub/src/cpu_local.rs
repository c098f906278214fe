//! The per-vCPU block: one [`CpuLocal`] per possible vCPU, in `CPU_LOCAL`. Each architecture's
//! boot entry points a register at the vCPU's block (x86_64: `%gs`, aarch64: TPIDRRO_EL0) and
//! reaches its fields at fixed offsets from there (`arch::*::percpu`). The layer above (the
//! thread runtime) owns [`RT_WORDS`] words at [`RT_OFFSET`].

use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use protocol::MAX_VCPUS;

/// Words of the block owned by the layer above, at `RT_OFFSET + 8 * i`.
pub const RT_WORDS: usize = 8;

/// One vCPU's block: two cache lines, so `_start` indexes the array with a shift.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CpuLocal {
    /// This block's address (offset 0).
    this: AtomicU64,
    /// The vCPU index (offset 8).
    vcpu: AtomicU32,
    /// Set while this vCPU formats a panic message.
    panicking: AtomicBool,
    /// Free for the layer above (kept for compatibility), at `USER_OFFSET`.
    user: AtomicU64,
    /// Preemption holds (held spinlocks) of the code running on this vCPU (`crate::preempt`).
    hold: AtomicU64,
    /// Work the layer above deferred while `hold` was non-zero; see `crate::preempt`.
    pending: AtomicU64,
    /// Top of this vCPU's alternate stack for CPU exceptions from user level; 0 = exceptions
    /// are fatal. The privileged stub clears it when it delivers one.
    exc_stack: AtomicU64,
    /// Scratch for the user-level exception return path (the faulting stack and instruction
    /// pointers).
    exc_rsp: AtomicU64,
    exc_rip: AtomicU64,
    /// Words owned by the layer above.
    rt: [AtomicU64; RT_WORDS],
}

/// Offset of [`CpuLocal`]'s field for the layer above.
pub const USER_OFFSET: usize = offset_of!(CpuLocal, user);
/// Offset of the block's own address.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const THIS_OFFSET: usize = offset_of!(CpuLocal, this);
/// Offset of the vCPU index.
pub(crate) const VCPU_OFFSET: usize = offset_of!(CpuLocal, vcpu);
/// Offset of the preemption-hold counter.
pub const HOLD_OFFSET: usize = offset_of!(CpuLocal, hold);
/// Offset of the pending-work word.
pub const PENDING_OFFSET: usize = offset_of!(CpuLocal, pending);
/// Offset of the alternate exception stack top.
pub(crate) const EXC_STACK_OFFSET: usize = offset_of!(CpuLocal, exc_stack);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const EXC_RSP_OFFSET: usize = offset_of!(CpuLocal, exc_rsp);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const EXC_RIP_OFFSET: usize = offset_of!(CpuLocal, exc_rip);
/// Offset of the first word owned by the layer above.
pub const RT_OFFSET: usize = offset_of!(CpuLocal, rt);

/// log2 of `size_of::<CpuLocal>()`, for `_start`.
pub(crate) const CPU_LOCAL_SHIFT: u32 = core::mem::size_of::<CpuLocal>().trailing_zeros();

const _: () = assert!(1 << CPU_LOCAL_SHIFT == core::mem::size_of::<CpuLocal>());
const _: () = assert!(RT_OFFSET + 8 * RT_WORDS <= core::mem::size_of::<CpuLocal>());

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: CpuLocal = CpuLocal {
    this: AtomicU64::new(0),
    vcpu: AtomicU32::new(0),
    panicking: AtomicBool::new(false),
    user: AtomicU64::new(0),
    hold: AtomicU64::new(0),
    pending: AtomicU64::new(0),
    exc_stack: AtomicU64::new(0),
    exc_rsp: AtomicU64::new(0),
    exc_rip: AtomicU64::new(0),
    rt: [ZERO; RT_WORDS],
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

    /// The armed alternate exception stack's top, or 0 (see `arm_exception_stack`; delivery
    /// disarms it). Written from another vCPU only for a stack nothing runs on.
    pub fn exception_stack(&self) -> &AtomicU64 {
        &self.exc_stack
    }

    /// Word `i` of the layer above's area.
    pub fn rt_word(&self, i: usize) -> &AtomicU64 {
        &self.rt[i]
    }
}

/// vCPU `vcpu`'s block (for code that inspects another vCPU's state, e.g. a stopped one).
pub fn cpu_local(vcpu: usize) -> &'static CpuLocal {
    &CPU_LOCAL[vcpu]
}

/// Fills `CPU_LOCAL[vcpu]`; returns its address (the architecture checks its register).
pub(crate) fn fill(vcpu: usize) -> u64 {
    let block = &CPU_LOCAL[vcpu];
    block
        .this
        .store(block as *const CpuLocal as u64, Ordering::Relaxed);
    block.vcpu.store(vcpu as u32, Ordering::Relaxed);
    block as *const CpuLocal as u64
}

impl CpuLocal {
    /// The field for the layer above (for `set_user`).
    pub(crate) fn user_field(&self) -> &AtomicU64 {
        &self.user
    }
}
