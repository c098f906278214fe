//! A fixed-capacity, lock-free bag for the upcall path's bookkeeping.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use activm_stub::preempt;

/// A fixed-capacity, lock-free bag for the upcall path's bookkeeping. The path from an upcall
/// record to continuing a preempted lock holder must take no lock (the holder may hold it: seed
/// 000 section 6) and allocate nothing (it may hold the heap lock). Each slot goes FREE ->
/// WRITING -> FULL -> READING -> FREE, claimed by compare-and-swap; a slot also carries a key
/// (an activation id, or 0) so takers can look for an item without claiming others.
pub(crate) struct Bag<T, const N: usize> {
    state: [AtomicU8; N],
    key: [AtomicU64; N],
    items: [UnsafeCell<MaybeUninit<T>>; N],
    len: AtomicU32,
}

// SAFETY: a slot's item is written only by the CPU that moved it FREE -> WRITING and read only
// by the one that moved it FULL -> READING; the state's release/acquire orders the accesses.
unsafe impl<T: Send, const N: usize> Sync for Bag<T, N> {}

const SLOT_FREE: u8 = 0;
const SLOT_WRITING: u8 = 1;
const SLOT_FULL: u8 = 2;
const SLOT_READING: u8 = 3;

impl<T: Copy, const N: usize> Bag<T, N> {
    pub(crate) const fn new() -> Self {
        Bag {
            state: [const { AtomicU8::new(SLOT_FREE) }; N],
            key: [const { AtomicU64::new(0) }; N],
            items: [const { UnsafeCell::new(MaybeUninit::uninit()) }; N],
            len: AtomicU32::new(0),
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    pub(crate) fn push(&self, key: u64, item: T) {
        let _hold = preempt::Hold::new();
        for i in 0..N {
            if self.state[i]
                .compare_exchange(
                    SLOT_FREE,
                    SLOT_WRITING,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                // SAFETY: the slot is ours (WRITING) until we publish it.
                unsafe { (*self.items[i].get()).write(item) };
                self.key[i].store(key, Ordering::Relaxed);
                self.len.fetch_add(1, Ordering::AcqRel);
                self.state[i].store(SLOT_FULL, Ordering::Release);
                return;
            }
        }
        panic!("activm-rt: upcall bookkeeping full ({N} entries)");
    }

    fn take_at(&self, i: usize) -> Option<T> {
        // SAFETY: claimed just now.
        self.claim(i).then(|| unsafe { self.read_out(i) })
    }

    /// Makes slot `i` ours (FULL to READING), if it holds an item.
    fn claim(&self, i: usize) -> bool {
        self.state[i]
            .compare_exchange(
                SLOT_FULL,
                SLOT_READING,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Moves the item out of slot `i` and frees the slot.
    ///
    /// # Safety
    /// The caller claimed slot `i` ([`Self::claim`]) and has not read it out since.
    unsafe fn read_out(&self, i: usize) -> T {
        // SAFETY: claimed from FULL, so written and published; the slot is ours (READING).
        let item = unsafe { (*self.items[i].get()).assume_init_read() };
        self.len.fetch_sub(1, Ordering::AcqRel);
        self.state[i].store(SLOT_FREE, Ordering::Release);
        item
    }

    /// Whether an item filed under `key` is in the bag (a snapshot).
    pub(crate) fn has_key(&self, key: u64) -> bool {
        (0..N).any(|i| {
            self.state[i].load(Ordering::Acquire) == SLOT_FULL
                && self.key[i].load(Ordering::Relaxed) == key
        })
    }

    /// Takes an item filed under `key`.
    pub(crate) fn take_key(&self, key: u64) -> Option<T> {
        let hold = preempt::Hold::new();
        let mut found = None;
        for i in 0..N {
            if self.state[i].load(Ordering::Acquire) == SLOT_FULL
                && self.key[i].load(Ordering::Relaxed) == key
            {
                // The slot may have been refilled since: the key is checked again once ours.
                if let Some(item) = self.take_if_key(i, key) {
                    found = Some(item);
                    break;
                }
            }
        }
        drop(hold);
        found
    }

    fn take_if_key(&self, i: usize, key: u64) -> Option<T> {
        if !self.claim(i) {
            return None;
        }
        if self.key[i].load(Ordering::Relaxed) != key {
            self.state[i].store(SLOT_FULL, Ordering::Release);
            return None;
        }
        // SAFETY: claimed above, not read out.
        Some(unsafe { self.read_out(i) })
    }

    /// Takes the first item in a slot at or after `from`, with that slot's index. A pass that
    /// goes on from the index after the one returned visits every item it started with once,
    /// even if items are pushed back meanwhile (they may land in slots already passed).
    pub(crate) fn pop_from(&self, from: usize) -> Option<(usize, T)> {
        if self.len() == 0 {
            return None;
        }
        let hold = preempt::Hold::new();
        let mut found = None;
        for i in from..N {
            if self.state[i].load(Ordering::Relaxed) == SLOT_FULL {
                if let Some(item) = self.take_at(i) {
                    found = Some((i, item));
                    break;
                }
            }
        }
        drop(hold);
        found
    }

    /// Takes any item.
    pub(crate) fn pop(&self) -> Option<T> {
        if self.len() == 0 {
            return None;
        }
        let hold = preempt::Hold::new();
        let mut found = None;
        for i in 0..N {
            if self.state[i].load(Ordering::Relaxed) == SLOT_FULL {
                if let Some(item) = self.take_at(i) {
                    found = Some(item);
                    break;
                }
            }
        }
        drop(hold);
        found
    }

    /// Calls `f` on every item (diagnostics, once things are quiet).
    pub(crate) fn for_each_item(&self, mut f: impl FnMut(&T)) {
        for i in 0..N {
            if self.state[i].load(Ordering::Acquire) == SLOT_FULL {
                // SAFETY: a FULL slot holds an initialized item; diagnostics only, read when
                // nobody takes items (a racing take would make this a stale copy, never UB for
                // the plain-integer records it is used on).
                f(unsafe { (*self.items[i].get()).assume_init_ref() });
            }
        }
    }
}
