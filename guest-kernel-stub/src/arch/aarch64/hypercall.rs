//! The aarch64 hypercall instruction: one 8-byte load `ldr x0, [x8]`, arguments in x0-x3.
//!
//! The load must be a plain `LDR (register/immediate, no writeback)` so the abort syndrome KVM
//! sees is valid (ISV) and the access becomes a `KVM_EXIT_MMIO`; the value the VMM supplies lands
//! in x0.

/// Loads 8 bytes from `addr` with the hypercall argument registers set; returns the value loaded.
///
/// # Safety
/// `addr` is in the hypercall page, and the arguments satisfy the call's rules (the VMM acts on
/// them, e.g. reads guest memory through a pointer).
#[inline(always)]
pub(crate) unsafe fn load(addr: u64, a0: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    let ret: u64;
    // SAFETY: the caller upholds the call's contract; the VMM only writes the destination x0.
    unsafe {
        core::arch::asm!(
            "ldr x0, [x8]",
            in("x8") addr,
            inout("x0") a0 => ret,
            in("x1") a1,
            in("x2") a2,
            in("x3") a3,
            options(nostack, preserves_flags),
        );
    }
    ret
}

/// Sleeps until an interrupt is pending: `wfi` at EL0 (SCTLR_EL1.nTWI lets EL0 run it; KVM
/// blocks the vCPU until an interrupt is pending), no VMM exit.
pub(crate) fn halt() {
    // SAFETY: `wfi` only waits.
    unsafe { core::arch::asm!("wfi", options(nomem, nostack, preserves_flags)) };
}
