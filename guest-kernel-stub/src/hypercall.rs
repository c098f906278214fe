//! Hypercalls: one 8-byte load from `HYPERCALL_BASE + 8 * nr` (see `protocol::hypercall`).
//! Each one exits to the VMM (~18 us).

use protocol::arch::current::HYPERCALL_BASE;
use protocol::hypercall::Hypercall;

/// Issues hypercall `nr` with up to four arguments; returns the VMM's result.
///
/// # Safety
/// The arguments satisfy the call's rules (the VMM acts on them). An unknown `nr` stops the
/// guest.
#[inline(always)]
pub unsafe fn raw(nr: u64, a0: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    // SAFETY: the address is in the hypercall page; the caller upholds the call's contract.
    unsafe { crate::arch::current::hypercall::load(HYPERCALL_BASE + 8 * nr, a0, a1, a2, a3) }
}

/// Issues a hypercall that never returns.
fn no_return(call: Hypercall, a0: u64, a1: u64) -> ! {
    // SAFETY: callers pass arguments valid for `call` (a code, or a live buffer).
    unsafe { raw(call as u64, a0, a1, 0, 0) };
    // The VMM does not resume a vCPU after these calls.
    loop {
        core::hint::spin_loop();
    }
}

/// Writes `bytes` (at most `protocol::hypercall::MAX_WRITE_LEN`) to the console; returns the
/// length written.
pub fn console_write(bytes: &[u8]) -> u64 {
    // SAFETY: the buffer is live and identity-mapped (virtual = guest-physical).
    unsafe {
        raw(
            Hypercall::ConsoleWrite as u64,
            bytes.as_ptr() as u64,
            bytes.len() as u64,
            0,
            0,
        )
    }
}

/// Stops the whole guest; `code & 0xff` becomes activm's exit status.
pub fn exit(code: i32) -> ! {
    no_return(Hypercall::Exit, code as u64, 0)
}

/// Stops the guest with `message` (UTF-8) reported as a panic.
pub fn panic(message: &[u8]) -> ! {
    let len = message
        .len()
        .min(protocol::hypercall::MAX_WRITE_LEN as usize);
    no_return(Hypercall::Panic, message.as_ptr() as u64, len as u64)
}

/// This vCPU is done; the guest goes on with the others.
pub fn vcpu_stop() -> ! {
    no_return(Hypercall::VcpuStop, 0, 0)
}

/// Sleeps until an interrupt is pending for this vCPU (it is delivered right after).
pub fn halt() {
    // SAFETY: halt takes no arguments.
    unsafe { raw(Hypercall::Halt as u64, 0, 0, 0, 0) };
}
