//! Thread stacks (NPTL-style cache, Drepper & Molnar 2003): the slots of the VMM's region
//! (`stack/region.rs`, re-exported here) and their pool.
//!
//! A thread whose requested stack fits a slot gets one; free slots are cached per vCPU
//! ([`crate::percpu::STACK_CACHE`]), then in a global list; never-used slots are handed out in
//! order. A thread that asks for more than a slot, or finds no slot left, gets a stack from the
//! heap **without a guard page**: an overflow there corrupts memory instead of faulting.
//!
//! Stacks are bound lazily, when a thread first runs, and given back when it exits, so 10,000
//! spawned-but-not-yet-run threads need no stacks at all.
//!
//! Allocation and release happen in scheduler context; each entry of the per-vCPU cache is taken
//! and filled by one atomic operation, as code the VMM took away may go on with this vCPU's
//! cache from another vCPU (a preemption hold does not stop the VMM).

use core::alloc::Layout;
use core::sync::atomic::{AtomicU32, Ordering};

use activm_stub::sync::SpinLock;

use crate::percpu::{self, Line, Pcpu, NO_SLOT};

pub mod region;

pub use region::{guard_owner, init, slot_usable, Stack, GUARD};
use region::{nr_slots, slot_stack};

/// Slots never handed out yet start here.
static NEXT_FRESH: AtomicU32 = AtomicU32::new(0);
/// Free slots beyond the per-vCPU caches: an intrusive list, each free slot's next index
/// stored in its own (unused) top word, `u32::MAX` = end (no allocation under the lock).
static FREE: Line<SpinLock<u32>> = Line(SpinLock::new(u32::MAX));

/// The word of a free slot that holds the next free slot's index.
fn free_link(slot: u32) -> *mut u32 {
    (slot_stack(slot).hi - 8) as *mut u32
}
/// Heap stacks currently allocated (statistics, tests).
pub static HEAP_STACKS: Line<AtomicU32> = Line(AtomicU32::new(0));

/// Slots in the global free list (changed under its lock).
static FREE_LEN: AtomicU32 = AtomicU32::new(0);

/// Slots currently in use (statistics, tests): slots ever handed out minus the free ones (the
/// global list and the per-vCPU caches). Exact when no stack is being taken or given back; the
/// hot paths count nothing.
pub fn slots_in_use() -> u64 {
    let cached: u64 = crate::percpu::pcpus()
        .iter()
        .map(|p| {
            p.stacks
                .iter()
                .filter(|s| s.load(Ordering::Relaxed) != NO_SLOT)
                .count() as u64
        })
        .sum();
    let handed_out = u64::from(NEXT_FRESH.load(Ordering::Relaxed).min(nr_slots()));
    handed_out.saturating_sub(u64::from(FREE_LEN.load(Ordering::Relaxed)) + cached)
}

/// A stack of at least `size` bytes (0: a slot). Scheduler context.
pub fn alloc(size: usize) -> Option<Stack> {
    let usable = slot_usable();
    if size <= usable && usable > 0 {
        if let Some(slot) = take_slot() {
            return Some(slot_stack(slot));
        }
    }
    let size = if size == 0 {
        usable.max(64 * 1024)
    } else {
        size
    };
    let size = (size + 4095) & !4095;
    let layout = Layout::from_size_align(size, 16).ok()?;
    // SAFETY: the layout has a non-zero size.
    let lo = unsafe { alloc::alloc::alloc(layout) };
    if lo.is_null() {
        return None;
    }
    HEAP_STACKS.fetch_add(1, Ordering::Relaxed);
    Some(Stack {
        lo: lo as usize,
        hi: lo as usize + size,
        slot: u32::MAX,
    })
}

fn take_slot() -> Option<u32> {
    // The cache is per vCPU, but a preemption hold does not stop the VMM: a scheduler context
    // it takes here is adopted on another vCPU and goes on with this `p`, while this vCPU's next
    // activation takes from the same cache. A count changed in a separate step then handed one
    // slot to two threads (two threads on one stack: a thread run twice, a return into a TCB);
    // each entry is taken by one atomic swap instead.
    let cached = cache_take(percpu::this());
    if cached.is_some() {
        return cached;
    }
    {
        let mut head = FREE.lock();
        if *head != u32::MAX {
            let slot = *head;
            // SAFETY: a free slot's top word holds the next free index (written by `free`).
            *head = unsafe { free_link(slot).read() };
            FREE_LEN.fetch_sub(1, Ordering::Relaxed);
            return Some(slot);
        }
    }
    let slots = nr_slots();
    let mut next = NEXT_FRESH.load(Ordering::Relaxed);
    while next < slots {
        match NEXT_FRESH.compare_exchange_weak(next, next + 1, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return Some(next),
            Err(now) => next = now,
        }
    }
    None
}

/// Takes a slot from `p`'s stack cache: one atomic swap per entry, so callers on several vCPUs
/// at once (see `take_slot`) never get the same slot.
fn cache_take(p: &Pcpu) -> Option<u32> {
    p.stacks.iter().rev().find_map(|s| {
        if s.load(Ordering::Relaxed) == NO_SLOT {
            return None;
        }
        Some(s.swap(NO_SLOT, Ordering::Acquire)).filter(|&slot| slot != NO_SLOT)
    })
}

/// Puts `slot` into `p`'s stack cache (one CAS per entry); false if the cache is full.
fn cache_put(p: &Pcpu, slot: u32) -> bool {
    p.stacks.iter().any(|s| {
        s.load(Ordering::Relaxed) == NO_SLOT
            && s.compare_exchange(NO_SLOT, slot, Ordering::Release, Ordering::Relaxed)
                .is_ok()
    })
}

/// Takes a slot from vCPU `vcpu`'s stack cache from whatever vCPU this runs on, as code the VMM
/// moved does (for the runtime's tests: the caller must give it back with [`cache_put_of`]).
#[doc(hidden)]
pub fn cache_take_of(vcpu: u32) -> Option<u32> {
    cache_take(percpu::of(vcpu))
}

/// Gives back a slot [`cache_take_of`] took (tests); false if that cache is full (the slot is
/// then put on the global list).
#[doc(hidden)]
pub fn cache_put_of(vcpu: u32, slot: u32) -> bool {
    if cache_put(percpu::of(vcpu), slot) {
        return true;
    }
    let mut head = FREE.lock();
    // SAFETY: the caller took the slot from a cache and never used its memory.
    unsafe { free_link(slot).write(*head) };
    *head = slot;
    FREE_LEN.fetch_add(1, Ordering::Relaxed);
    false
}

/// Gives a stack back. Scheduler context (the stack is not in use).
pub fn free(stack: Stack) {
    if stack.is_heap() {
        let size = stack.hi - stack.lo;
        HEAP_STACKS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: allocated by `alloc` with this size and alignment 16.
        unsafe {
            alloc::alloc::dealloc(
                stack.lo as *mut u8,
                Layout::from_size_align_unchecked(size, 16),
            )
        };
        return;
    }
    if !cache_put(percpu::this(), stack.slot) {
        let mut head = FREE.lock();
        // SAFETY: the slot is free and mapped; its top word is ours until it is reused.
        unsafe { free_link(stack.slot).write(*head) };
        *head = stack.slot;
        FREE_LEN.fetch_add(1, Ordering::Relaxed);
    }
}
