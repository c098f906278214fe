//! Hypercalls: one 8-byte load from `HYPERCALL_BASE + 8 * nr` (see `protocol::hypercall`).
//! Each one exits to the VMM (18-60 us, by host; docs/architecture.md).

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

/// Sleeps until an interrupt is pending for this vCPU (it is delivered right after): the `halt`
/// call on x86_64, `wfi` at EL0 on aarch64 (no VMM exit).
pub fn halt() {
    crate::arch::current::hypercall::halt();
}

/// `blk_info(what)`: the block device's capacity in sectors (`BLK_INFO_SECTORS`; 0 without a
/// device) or its flags (`BLK_INFO_FLAGS`). See `protocol::blk`.
pub fn blk_info(what: u64) -> u64 {
    // SAFETY: blk_info only reads its selector.
    unsafe { raw(Hypercall::BlkInfo as u64, what, 0, 0, 0) }
}

/// Reads `count` sectors from `sector` into `buf`; returns `BLK_OK` or a `BLK_ERR_*` code.
/// May block this vCPU in the VMM.
///
/// # Safety
/// `buf` is live, identity-mapped guest memory at or above the image base, writable for
/// `count * SECTOR_SIZE` bytes that nothing else uses until the call returns; `count` is in
/// `1..=BLK_MAX_SECTORS` (anything else stops the guest).
pub unsafe fn blk_read(sector: u64, buf: *mut u8, count: u64) -> u64 {
    // SAFETY: the caller upholds the buffer contract above.
    unsafe { raw(Hypercall::BlkRead as u64, sector, buf as u64, count, 0) }
}

/// Writes `count` sectors from `buf` at `sector`; returns `BLK_OK` or a `BLK_ERR_*` code. May
/// block this vCPU in the VMM.
///
/// # Safety
/// As [`blk_read`], with `buf` readable.
pub unsafe fn blk_write(sector: u64, buf: *const u8, count: u64) -> u64 {
    // SAFETY: the caller upholds the buffer contract above.
    unsafe { raw(Hypercall::BlkWrite as u64, sector, buf as u64, count, 0) }
}

/// Makes every completed write durable; returns `BLK_OK` or a `BLK_ERR_*` code. Blocks.
pub fn blk_flush() -> u64 {
    // SAFETY: blk_flush takes no arguments.
    unsafe { raw(Hypercall::BlkFlush as u64, 0, 0, 0, 0) }
}

/// Registers the completion ring of asynchronous block requests (`protocol::blk::BlkRing`);
/// returns `BLK_OK` or `BLK_ERR_NO_DEVICE`.
///
/// # Safety
/// `ring` is 64-byte aligned, identity-mapped guest memory at or above the image base that
/// stays the ring for the guest's lifetime (the VMM writes it from its I/O threads).
pub unsafe fn blk_ring_setup(ring: *const protocol::blk::BlkRing) -> u64 {
    // SAFETY: the caller upholds the ring contract above.
    unsafe { raw(Hypercall::BlkRingSetup as u64, ring as u64, 0, 0, 0) }
}

/// Starts a block request without blocking: `op` is a `BLK_OP_*`, `tag` below
/// `BLK_RING_CAPACITY` and not in flight. Returns the result if the request completed at once,
/// else `BLK_IN_FLIGHT` (the completion comes in the ring under `tag`).
///
/// # Safety
/// As [`blk_read`] / [`blk_write`], except that the buffer must stay untouched until the
/// completion is in the ring, not just until the call returns.
pub unsafe fn blk_submit(sector: u64, buf: u64, op: u64, count: u64, tag: u64) -> u64 {
    // SAFETY: the caller upholds the buffer and tag contracts above.
    unsafe {
        raw(
            Hypercall::BlkSubmit as u64,
            sector,
            buf,
            protocol::blk::blk_submit_arg(op, count),
            tag,
        )
    }
}

/// Registers the submission ring of asynchronous block requests
/// (`protocol::blk_submit::BlkSubmitRing`), after [`blk_ring_setup`]; returns `BLK_OK` or
/// `BLK_ERR_NO_DEVICE`.
///
/// # Safety
/// As [`blk_ring_setup`], for `ring` (the VMM reads it from its disk thread).
pub unsafe fn blk_submit_ring_setup(ring: *const protocol::blk_submit::BlkSubmitRing) -> u64 {
    // SAFETY: the caller upholds the ring contract above.
    unsafe { raw(Hypercall::BlkSubmitRingSetup as u64, ring as u64, 0, 0, 0) }
}

/// Wakes the submission ring's consumer with a store the host takes in the kernel (an
/// ioeventfd: no exit to the VMM; a host without one exits and is served the same way).
pub fn blk_doorbell() {
    let addr = protocol::blk_submit::blk_doorbell_address(HYPERCALL_BASE);
    // SAFETY: the doorbell's slot in the hypercall page is mapped (uncached, user-accessible)
    // with nothing behind it; a 4-byte store there only signals the VMM.
    unsafe { core::ptr::write_volatile(addr as *mut u32, protocol::blk_submit::BLK_DOORBELL_RING) };
}

/// The transmit rings' doorbell without an exit (`protocol::net::net_doorbell_address`; only
/// with `SHARED_FEATURE_NET_DOORBELL`).
pub fn net_doorbell() {
    let addr = protocol::net::net_doorbell_address(HYPERCALL_BASE);
    // SAFETY: the `net` slot of the hypercall page is mapped (uncached, user-accessible) with
    // nothing behind it; a 4-byte store there only signals the VMM, which offered it.
    unsafe { core::ptr::write_volatile(addr as *mut u32, protocol::net::NET_DOORBELL_RING) };
}

/// The same doorbell through an exit (the `blk_doorbell` hypercall, a load).
pub fn blk_doorbell_exit() {
    // SAFETY: blk_doorbell takes no arguments.
    unsafe { raw(Hypercall::BlkDoorbell as u64, 0, 0, 0, 0) };
}
