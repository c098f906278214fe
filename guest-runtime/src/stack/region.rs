//! The VMM's thread-stack region and [`Stack`], what a thread's TCB holds.
//!
//! The VMM maps `BootInfo::nr_stack_slots` slots of `stack_slot_size` bytes from
//! `stack_region`, the lowest 4 KiB page of each left unmapped: a guard page, so running off
//! the stack faults (`crate::fault` turns that into "thread 'x' overflowed its stack"). Handing
//! slots out is the pool's work (`stack.rs`).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Size of the guard page under every slot.
pub const GUARD: usize = 4096;

/// A thread stack: usable `[lo, hi)`; `slot` is the slot index, or `u32::MAX` for a heap stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stack {
    pub lo: usize,
    pub hi: usize,
    pub slot: u32,
}

impl Stack {
    pub fn is_heap(&self) -> bool {
        self.slot == u32::MAX
    }

    /// The guard page under this stack, if it has one.
    pub fn guard(&self) -> Option<(usize, usize)> {
        (!self.is_heap()).then(|| (self.lo - GUARD, self.lo))
    }
}

static REGION_BASE: AtomicU64 = AtomicU64::new(0);
static SLOT_SIZE: AtomicU64 = AtomicU64::new(0);
static NR_SLOTS: AtomicU32 = AtomicU32::new(0);

/// Takes the VMM's thread-stack region from the boot information.
pub fn init() {
    let info = activm_stub::boot_info();
    REGION_BASE.store(info.stack_region, Ordering::Relaxed);
    SLOT_SIZE.store(info.stack_slot_size, Ordering::Relaxed);
    NR_SLOTS.store(info.nr_stack_slots, Ordering::Relaxed);
}

/// Slots in the region.
#[inline]
pub fn nr_slots() -> u32 {
    NR_SLOTS.load(Ordering::Relaxed)
}

/// Usable bytes of a slot (0 if the VMM gave no region).
#[inline]
pub fn slot_usable() -> usize {
    (SLOT_SIZE.load(Ordering::Relaxed) as usize).saturating_sub(GUARD)
}

/// Slot `slot`'s stack.
#[inline]
pub fn slot_stack(slot: u32) -> Stack {
    let base = REGION_BASE.load(Ordering::Relaxed) as usize;
    let size = SLOT_SIZE.load(Ordering::Relaxed) as usize;
    let lo = base + slot as usize * size + GUARD;
    Stack {
        lo,
        hi: base + (slot as usize + 1) * size,
        slot,
    }
}

/// The slot stack whose guard page contains `addr`, if any.
pub fn guard_owner(addr: u64) -> Option<Stack> {
    let base = REGION_BASE.load(Ordering::Relaxed);
    let size = SLOT_SIZE.load(Ordering::Relaxed);
    let slots = u64::from(NR_SLOTS.load(Ordering::Relaxed));
    if size == 0 || addr < base || addr >= base + size * slots {
        return None;
    }
    let slot = (addr - base) / size;
    ((addr - base) % size < GUARD as u64).then(|| slot_stack(slot as u32))
}
