//! The runtime's self-description for the VMM's hang report: where its list of threads, its
//! per-vCPU words and run queues are, and the layout of a thread control block (TCB).
//!
//! The runtime writes a [`RuntimeDiag`] somewhere in its memory once at start-up and stores its
//! address in [`crate::shared::SharedHeader::runtime_diag`]. The VMM reads it only when it
//! stops a guest that did not end by itself (`--timeout`, a second host signal) and trusts
//! none of it: every address is checked against guest RAM, every list walk is bounded and
//! stops at a repeated entry, every length is clamped. A guest that publishes nothing (0) or
//! garbage gets a report without its threads.
//!
//! Addresses are guest addresses of identity-mapped RAM. Every word the table points at is
//! little-endian; its width is given with the field.

use crate::MAX_VCPUS;

/// [`RuntimeDiag::magic`]: "ACTVDIAG".
pub const DIAG_MAGIC: u64 = u64::from_le_bytes(*b"ACTVDIAG");

/// The TCB's `wake` word (u32): how a parked thread stands with its waker.
pub const WAKE_WAITING: u32 = 0;
pub const WAKE_WOKEN: u32 = 1;
pub const WAKE_PARKED: u32 = 2;

/// The TCB's `event` word (u32): the last scheduling event, `EVENT_* << 8 | vCPU`.
pub const EVENT_NAMES: [&str; 10] = [
    "?",
    "spawned",
    "queued",
    "running",
    "parked",
    "resumed",
    "continued",
    "exited",
    "global",
    "next",
];

/// The TCB's `flags` word (u32): the program's main thread.
pub const TCB_FLAG_MAIN: u32 = 1 << 0;
/// The TCB's `flags` word: blocked in the VMM (a BLOCKED record named its activation).
pub const TCB_FLAG_BLOCKED_IN_VMM: u32 = 1 << 1;

/// Where each field of a TCB is, as a byte offset from the TCB's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcbLayout {
    /// Bytes of a TCB: every offset below is less.
    pub size: u32,
    /// u64: the next TCB of the list of every thread (0 ends the list).
    pub next: u32,
    /// u64: the thread's id.
    pub id: u32,
    /// u32: references; 0 is a free TCB (skipped).
    pub refs: u32,
    /// u32: `WAKE_*`.
    pub wake: u32,
    /// u32: the last scheduling event (`EVENT_NAMES`).
    pub event: u32,
    /// u32: `TCB_FLAG_*`.
    pub flags: u32,
    /// u64: the saved stack pointer of a thread that is not running.
    pub sp: u32,
    /// u64: the TSC deadline of a sleeping thread (0: none).
    pub sleep: u32,
    /// u64: the address of the name's UTF-8 bytes, less `name_delta` (a word of 0: no name).
    /// An offset of 0 here or in `name_len`: the runtime publishes no names.
    pub name_ptr: u32,
    /// u64: the name's length in bytes.
    pub name_len: u32,
    /// Added to the word at `name_ptr` to get the bytes' address.
    pub name_delta: u32,
}

/// One vCPU's runtime words.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuDiag {
    /// u64: the TCB running on this vCPU (0: the scheduler runs).
    pub current: u64,
    /// u64: non-zero while the vCPU runs scheduler code.
    pub in_sched: u64,
    /// u64: non-zero while the scheduler idles with nothing in flight.
    pub idle: u64,
    /// u64: the TSC deadline this vCPU's one-shot timer is armed for (0: not armed).
    pub timer: u64,
    /// u32 each: the run queue's consumer and producer indices (length: `tail - head`).
    pub runq_head: u64,
    pub runq_tail: u64,
    /// u64: the thread in the vCPU's run-next slot (0: none).
    pub runq_next: u64,
    pub _reserved: u64,
}

/// The runtime's self-description (see the module documentation).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeDiag {
    /// [`DIAG_MAGIC`].
    pub magic: u64,
    /// `size_of::<RuntimeDiag>()` as the runtime was built.
    pub size: u32,
    /// Entries of `vcpus` filled in.
    pub nr_vcpus: u32,
    /// u64: the first TCB of the list of every thread (through [`TcbLayout::next`]).
    pub threads: u64,
    /// u64 each: bit i set = vCPU i is halted idle / spinning idle.
    pub halted: u64,
    pub spinning: u64,
    /// u64: threads in the global run queue.
    pub global_len: u64,
    pub tcb: TcbLayout,
    pub vcpus: [VcpuDiag; MAX_VCPUS],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layout() {
        assert_eq!(size_of::<TcbLayout>(), 48);
        assert_eq!(offset_of!(TcbLayout, name_delta), 44);
        assert_eq!(size_of::<VcpuDiag>(), 64);
        assert_eq!(offset_of!(VcpuDiag, runq_tail), 40);
        assert_eq!(offset_of!(RuntimeDiag, size), 8);
        assert_eq!(offset_of!(RuntimeDiag, nr_vcpus), 12);
        assert_eq!(offset_of!(RuntimeDiag, threads), 16);
        assert_eq!(offset_of!(RuntimeDiag, global_len), 40);
        assert_eq!(offset_of!(RuntimeDiag, tcb), 48);
        assert_eq!(offset_of!(RuntimeDiag, vcpus), 96);
        assert_eq!(size_of::<RuntimeDiag>(), 96 + 64 * MAX_VCPUS);
    }
}
