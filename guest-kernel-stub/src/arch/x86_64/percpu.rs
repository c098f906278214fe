//! The per-vCPU block, reached through `%gs` without leaving CPL3. `_start` (CPL0) points
//! IA32_GS_BASE at `CPU_LOCAL[vcpu]`; the CPL3 entry fills the block and checks `%gs:0`.
//!
//! Every field sits at a fixed `%gs` offset, so a single instruction (`incq %gs:HOLD_OFFSET`,
//! `xchg %rax, %gs:PENDING_OFFSET`) reads or changes *this* vCPU's copy: a CPL3 thread that can be
//! interrupted and moved to another vCPU between two instructions never mixes two vCPUs' fields
//! inside one instruction. The layer above (the thread runtime) owns [`RT_WORDS`] words at
//! [`RT_OFFSET`].

use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use protocol::MAX_VCPUS;

/// Words of the block owned by the layer above, at `%gs:RT_OFFSET + 8 * i`.
pub const RT_WORDS: usize = 8;

/// One vCPU's block: two cache lines, so `_start` indexes the array with a shift.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CpuLocal {
    /// This block's address (`%gs:0`).
    this: AtomicU64,
    /// The vCPU index (`%gs:8`).
    vcpu: AtomicU32,
    /// Set while this vCPU formats a panic message.
    panicking: AtomicBool,
    /// Free for the layer above (kept for compatibility), at `%gs:USER_OFFSET`.
    user: AtomicU64,
    /// Preemption holds (held spinlocks) of the code running on this vCPU (`crate::preempt`).
    hold: AtomicU64,
    /// Work the layer above deferred while `hold` was non-zero; see `crate::preempt`.
    pending: AtomicU64,
    /// Top of this vCPU's alternate stack for CPU exceptions from CPL3; 0 = exceptions are fatal.
    /// The CPL0 stub clears it when it delivers one (a fault in the handler is then fatal).
    exc_stack: AtomicU64,
    /// Scratch for the CPL3 exception return path (the faulting rsp and rip).
    exc_rsp: AtomicU64,
    exc_rip: AtomicU64,
    /// Words owned by the layer above.
    rt: [AtomicU64; RT_WORDS],
}

/// `%gs` offset of [`CpuLocal`]'s field for the layer above.
pub const USER_OFFSET: usize = offset_of!(CpuLocal, user);
/// `%gs` offset of the preemption-hold counter.
pub const HOLD_OFFSET: usize = offset_of!(CpuLocal, hold);
/// `%gs` offset of the pending-work word.
pub const PENDING_OFFSET: usize = offset_of!(CpuLocal, pending);
/// `%gs` offset of the alternate exception stack top.
pub(crate) const EXC_STACK_OFFSET: usize = offset_of!(CpuLocal, exc_stack);
pub(crate) const EXC_RSP_OFFSET: usize = offset_of!(CpuLocal, exc_rsp);
pub(crate) const EXC_RIP_OFFSET: usize = offset_of!(CpuLocal, exc_rip);
/// `%gs` offset of the first word owned by the layer above.
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

    /// Word `i` of the layer above's area.
    pub fn rt_word(&self, i: usize) -> &AtomicU64 {
        &self.rt[i]
    }
}

/// vCPU `vcpu`'s block (for code that inspects another vCPU's state, e.g. a stopped one).
pub fn cpu_local(vcpu: usize) -> &'static CpuLocal {
    &CPU_LOCAL[vcpu]
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
