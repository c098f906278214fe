//! The Rust side of a new activation's entry, the same on every architecture: each
//! architecture's `entry.rs` emits `__rt_activation_entry` and its window labels in assembly,
//! lays out [`OldWords`] for it, and re-exports these names.

/// Tag on a vCPU's activation word while an activation entry resets the words it claimed.
/// An activation taken away inside that window did nothing: its record's handler files the
/// state before it (from the entry's stack) and the next activation, finding the tag, files
/// nothing (the words are half reset: filing them would give stacks away twice).
pub const CLAIMING: u64 = 1 << 63;

/// The words `__rt_activation_entry` saves before it claims the vCPU, on its new stack (each
/// architecture's assembly checks this layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OldWords {
    pub current: u64,
    pub in_sched: u64,
    pub sched_idle: u64,
    pub sched_top: u64,
    pub hold: u64,
    pub activation: u64,
    pub new_top: u64,
}

/// A context taken inside an activation entry (possibly in the stub's trampoline on top of it).
#[derive(Clone, Copy, Debug)]
pub struct InEntry {
    /// Where the entry was.
    pub pc: u64,
    /// The top of the entry's activation stack.
    pub stack_top: u64,
    /// The words the entry had saved, if it had claimed the vCPU (with the previous activation
    /// filled in when the claim was the last thing it did).
    pub saved: Option<OldWords>,
}

extern "C" {
    fn __rt_activation_entry();
    static __rt_act_window_start: u8;
    static __rt_act_claimed: u8;
    static __rt_act_window_end: u8;
}

/// The address a new activation starts at (registered with `sa_register`).
pub fn entry_address() -> u64 {
    __rt_activation_entry as *const () as u64
}

/// The entry's unsafe window `(start, claimed, end)`: from `start` to `end` the vCPU's words are
/// not to be trusted; from `claimed` on they are this activation's (tagged [`CLAIMING`]).
pub fn window() -> (u64, u64, u64) {
    (
        core::ptr::addr_of!(__rt_act_window_start) as u64,
        core::ptr::addr_of!(__rt_act_claimed) as u64,
        core::ptr::addr_of!(__rt_act_window_end) as u64,
    )
}
