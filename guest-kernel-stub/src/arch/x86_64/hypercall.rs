//! The x86_64 hypercall instruction: one 8-byte load, arguments in rdi, rsi, rdx, r10.

/// Loads 8 bytes from `addr` with the hypercall argument registers set; returns the value loaded.
///
/// # Safety
/// `addr` is in the hypercall page, and the arguments satisfy the call's rules (the VMM acts on
/// them, e.g. reads guest memory through a pointer).
#[inline(always)]
pub(crate) unsafe fn load(addr: u64, a0: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    let ret: u64;
    // SAFETY: the caller upholds the call's contract; the VMM only writes the destination rax.
    unsafe {
        core::arch::asm!(
            "mov rax, qword ptr [rax]",
            inout("rax") addr => ret,
            in("rdi") a0,
            in("rsi") a1,
            in("rdx") a2,
            in("r10") a3,
            options(nostack, preserves_flags),
        );
    }
    ret
}

/// Sleeps until an interrupt is pending: the `halt` call (`hlt` is privileged).
pub(crate) fn halt() {
    // SAFETY: halt takes no arguments.
    unsafe { crate::hypercall::raw(protocol::hypercall::Hypercall::Halt as u64, 0, 0, 0, 0) };
}
