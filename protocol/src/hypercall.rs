//! Hypercalls: how a guest asks the VMM for something.
//!
//! A hypercall is one 8-byte **load** from `hypercall_base + 8 * nr` (see
//! [`crate::arch::x86_64::HYPERCALL_BASE`]), a guest-physical page with no memory behind it, so
//! the access exits to the VMM. It works at any privilege level, on both architectures, and is
//! the only exit available from CPL3 on our KVM. Arguments travel in registers, the result is the
//! loaded value:
//!
//! | arch    | arguments 0..3           | result            |
//! |---------|--------------------------|-------------------|
//! | x86_64  | `rdi`, `rsi`, `rdx`, `r10` | the load's destination register |
//! | aarch64 | `x0`, `x1`, `x2`, `x3`     | the load's destination register |
//!
//! A load at an offset that is not a multiple of 8, any store to the page (but the block
//! doorbell's, [`crate::blk_submit`]), an unknown number, or
//! arguments that break a call's rules (a buffer outside guest memory, say) stop the guest with an
//! error naming the call: protocol violations are never silently ignored.

use crate::wire::wire_enum;

/// Size of the hypercall page.
pub const HYPERCALL_PAGE_SIZE: u64 = 4096;

wire_enum! {
    /// Hypercall numbers.
    pub enum Hypercall: u64 {
        /// `console_write(gpa, len) -> len`: write `len` bytes at guest-physical `gpa` to the console.
        ConsoleWrite = 1 => "console_write",
        /// `exit(code) -> !`: stop the whole guest; `code & 0xff` becomes activm's exit status.
        Exit = 2 => "exit",
        /// `panic(gpa, len) -> !`: stop the guest, report the UTF-8 message on stderr, fail.
        Panic = 3 => "panic",
        /// `fatal_trap() -> !`: issued by the CPL0 stub for an exception it cannot handle. The stub
        /// pushes `rax` and leaves the CPU's exception frame above it ([`crate::arch::x86_64::TrapFrame`]
        /// at the stack pointer); the VMM reports it with the registers.
        FatalTrap = 4 => "fatal_trap",
        /// `vcpu_stop() -> !`: this vCPU is done; the guest goes on with the others.
        VcpuStop = 5 => "vcpu_stop",
        /// `halt() -> 0`: sleep until an interrupt is pending for this vCPU.
        Halt = 6 => "halt",
        /// `sa_register(upcall_entry, flags) -> 0`: register the CPL3 upcall entry point.
        SaRegister = 16 => "sa_register",
        /// `sa_setconcurrency(n) -> previous`: the guest can use up to `n` vCPUs.
        SaSetConcurrency = 17 => "sa_setconcurrency",
        /// `sa_yield(wake_ns) -> 0`: this vCPU has no work; the VMM may give its processor
        /// away. With `SHARED_FEATURE_YIELD_WAKE`, a non-zero `wake_ns` asks for a processor
        /// back that many ns later (a timer is due); 0: only when the guest asks or an event
        /// comes. Returns only if the processor was kept: `SA_YIELD_DECLINED` (see
        /// `SHARED_FEATURE_YIELD_IO`), or 0.
        SaYield = 18 => "sa_yield",
        /// `sa_preempt(vcpu) -> 0`: deliver a USER upcall to one of the guest's vCPUs.
        SaPreempt = 19 => "sa_preempt",
        /// `sa_enable() -> 0`: start delivering upcalls (after the stack pool is filled).
        SaEnable = 20 => "sa_enable",
        /// `timeline_setup(gpa, nr_rings) -> 0`: register the runtime's timeline rings
        /// ([`crate::timeline`]), one per vCPU from `gpa`; only with
        /// `SHARED_FEATURE_TIMELINE`, once.
        TimelineSetup = 21 => "timeline_setup",
        /// `blk_info(what) -> value`: the block device ([`crate::blk`]): `BLK_INFO_SECTORS` gives its
        /// capacity in sectors (0: no device), `BLK_INFO_FLAGS` its `BLK_FLAG_*` bits.
        BlkInfo = 32 => "blk_info",
        /// `blk_read(sector, gpa, count) -> BLK_OK | BLK_ERR_*`: read `count` sectors into guest
        /// memory. May block this vCPU in the VMM (a BLOCKED upcall, then UNBLOCKED, with activations).
        BlkRead = 33 => "blk_read",
        /// `blk_write(sector, gpa, count) -> BLK_OK | BLK_ERR_*`: write `count` sectors from guest
        /// memory. May block like `blk_read`.
        BlkWrite = 34 => "blk_write",
        /// `blk_flush() -> BLK_OK | BLK_ERR_*`: make every completed write durable. Blocks.
        BlkFlush = 35 => "blk_flush",
        /// `blk_ring_setup(gpa) -> BLK_OK | BLK_ERR_NO_DEVICE`: register the guest's
        /// [`crate::blk::BlkRing`] for asynchronous requests (once).
        BlkRingSetup = 36 => "blk_ring_setup",
        /// `blk_submit(sector, gpa, op << 32 | count, tag) -> result | BLK_IN_FLIGHT`: start a
        /// request without blocking; its completion goes to the ring under `tag`.
        BlkSubmit = 37 => "blk_submit",
        /// `blk_submit_ring_setup(gpa) -> BLK_OK | BLK_ERR_NO_DEVICE`: register the guest's
        /// [`crate::blk_submit::BlkSubmitRing`] (once, after `blk_ring_setup`).
        BlkSubmitRingSetup = 38 => "blk_submit_ring_setup",
        /// `blk_doorbell() -> 0`: wake the submission ring's consumer. A 4-byte *store* to this
        /// slot is the same doorbell without an exit (an ioeventfd; one of the two stores
        /// allowed, with the `net` slot's).
        BlkDoorbell = 39 => "blk_doorbell",
        /// `net(op << 32 | socket, a1, a2, a3) -> value | -errno | NET_WAITING`: a socket
        /// operation through the VMM ([`crate::net`]). A 4-byte *store* of
        /// [`crate::net::NET_DOORBELL_RING`] to this slot is the transmit doorbell without an
        /// exit (`tx_flush_all` by the VMM's net thread; with
        /// [`crate::shared::SHARED_FEATURE_NET_DOORBELL`]).
        Net = 48 => "net",
        /// `net_ring_setup(gpa) -> 0 | -errno`: register the guest's [`crate::net::NetRing`].
        NetRingSetup = 49 => "net_ring_setup",
        /// `fs_*`: files in the guest's mounts ([`crate::fs`]); results `>= 0` or `-errno`.
        /// `fs_open(path, fs_open_arg(flags, mode)) -> fd`.
        FsOpen = 64 => "fs_open",
        /// `fs_close(fd) -> 0`.
        FsClose = 65 => "fs_close",
        /// `fs_read(fd, gpa, len) -> bytes read`.
        FsRead = 66 => "fs_read",
        /// `fs_write(fd, gpa, len) -> bytes written`.
        FsWrite = 67 => "fs_write",
        /// `fs_seek(fd, offset, whence) -> new offset`.
        FsSeek = 68 => "fs_seek",
        /// `fs_fstat(fd, gpa of FsStat) -> 0`.
        FsFstat = 69 => "fs_fstat",
        /// `fs_stat(path, gpa of FsStat, FS_STAT_FOLLOW | FS_STAT_NOFOLLOW) -> 0`.
        FsStat = 70 => "fs_stat",
        /// `fs_getdents(fd, gpa, len) -> bytes of dirent64 records`.
        FsGetdents = 71 => "fs_getdents",
        /// `fs_mkdir(path, mode) -> 0` (the mode's permission bits, `0o777`).
        FsMkdir = 72 => "fs_mkdir",
        /// `fs_unlink(path, FS_UNLINK_FILE | FS_UNLINK_DIR) -> 0`.
        FsUnlink = 73 => "fs_unlink",
        /// `fs_rename(old path, new path) -> 0`.
        FsRename = 74 => "fs_rename",
        /// `fs_fsync(fd) -> 0`.
        FsFsync = 75 => "fs_fsync",
    }
}

impl Hypercall {
    /// Highest valid hypercall number + 1 (the page holds 512 slots).
    pub const SLOTS: u64 = HYPERCALL_PAGE_SIZE / 8;

    /// The guest-physical address whose load performs this call.
    pub const fn address(self, hypercall_base: u64) -> u64 {
        hypercall_base + 8 * self as u64
    }
}

/// Decode a guest-physical address inside the hypercall page into a call number.
/// Returns `Err(offset)` for a misaligned access.
pub const fn decode(gpa: u64, hypercall_base: u64) -> Option<Result<u64, u64>> {
    if gpa < hypercall_base || gpa >= hypercall_base + HYPERCALL_PAGE_SIZE {
        return None;
    }
    let offset = gpa - hypercall_base;
    if !offset.is_multiple_of(8) {
        Some(Err(offset))
    } else {
        Some(Ok(offset / 8))
    }
}

/// Returned by a call this VMM does not implement (yet); the guest may fall back.
pub const HC_UNSUPPORTED: u64 = u64::MAX;

/// `sa_yield` with block requests in flight, and no other guest wants the processor: kept
/// (see [`crate::shared::SHARED_FEATURE_YIELD_IO`]).
pub const SA_YIELD_DECLINED: u64 = 2;

/// Largest buffer `console_write` and `panic` accept in one call.
pub const MAX_WRITE_LEN: u64 = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_pinned() {
        assert_eq!(Hypercall::ConsoleWrite as u64, 1);
        assert_eq!(Hypercall::Exit as u64, 2);
        assert_eq!(Hypercall::Panic as u64, 3);
        assert_eq!(Hypercall::FatalTrap as u64, 4);
        assert_eq!(Hypercall::VcpuStop as u64, 5);
        assert_eq!(Hypercall::Halt as u64, 6);
        assert_eq!(Hypercall::SaRegister as u64, 16);
        assert_eq!(Hypercall::SaEnable as u64, 20);
        assert_eq!(Hypercall::TimelineSetup as u64, 21);
        assert_eq!(Hypercall::BlkInfo as u64, 32);
        assert_eq!(Hypercall::BlkRead as u64, 33);
        assert_eq!(Hypercall::BlkWrite as u64, 34);
        assert_eq!(Hypercall::BlkFlush as u64, 35);
        assert_eq!(Hypercall::BlkRingSetup as u64, 36);
        assert_eq!(Hypercall::BlkSubmit as u64, 37);
        assert_eq!(Hypercall::FsOpen as u64, 64);
        assert_eq!(Hypercall::FsFsync as u64, 75);
    }

    #[test]
    fn every_number_round_trips() {
        for nr in 0..Hypercall::SLOTS {
            if let Some(hc) = Hypercall::from_raw(nr) {
                assert_eq!(hc as u64, nr);
                assert_eq!(decode(hc.address(0x1000), 0x1000), Some(Ok(nr)));
            }
        }
    }

    #[test]
    fn decode_rejects_outside_and_misaligned() {
        assert_eq!(decode(0xfff, 0x1000), None);
        assert_eq!(decode(0x2000, 0x1000), None);
        assert_eq!(decode(0x1004, 0x1000), Some(Err(4)));
    }
}
