//! Per-vCPU caches of small heap blocks: a freed block of up to [`MAX_SMALL`] bytes goes to the
//! freeing vCPU's cache for its size class (16, 32, ... 256 bytes) when there is room, and the
//! next allocation of that class on that vCPU takes it, with no lock and no walk of talc's bins.
//!
//! Each cache entry is taken and filled by one atomic operation, never by a count changed in a
//! separate step: code the VMM takes away in the middle goes on from another vCPU with this
//! vCPU's cache while this vCPU's next activation uses it too, and an entry must never hand one
//! block to two owners. For the same reason no preemption hold is needed.

use core::alloc::Layout;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};

use protocol::MAX_VCPUS;

/// The largest block the caches keep.
pub const MAX_SMALL: usize = 256;
/// The smallest class.
const MIN_SMALL: usize = 16;
/// Alignment of every small block (what the size classes guarantee).
const SMALL_ALIGN: usize = 16;
/// Classes 16, 32, 64, 128 and 256 bytes.
const CLASSES: usize = 5;
/// Blocks kept per class and vCPU: the entries fill one cache line.
const ENTRIES: usize = 8;

/// A size class: blocks of `MIN_SMALL << index` bytes, aligned to 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Class(u8);

impl Class {
    /// The layout its blocks are allocated from talc (and given back) with.
    pub(super) fn layout(self) -> Layout {
        // SAFETY: a power of two from 16 to 256 with alignment 16 is a valid layout.
        unsafe { Layout::from_size_align_unchecked(MIN_SMALL << self.0, SMALL_ALIGN) }
    }
}

/// The class a block of `layout` is rounded up to, or `None` for talc itself.
#[inline]
pub(super) fn class(layout: Layout) -> Option<Class> {
    if layout.size() > MAX_SMALL || layout.align() > SMALL_ALIGN {
        return None;
    }
    let size = layout.size().max(MIN_SMALL).next_power_of_two();
    Some(Class(
        (size.trailing_zeros() - MIN_SMALL.trailing_zeros()) as u8,
    ))
}

/// One vCPU's caches, a cache line per class.
#[repr(C, align(64))]
struct Cache([[AtomicPtr<u8>; ENTRIES]; CLASSES]);

impl Cache {
    const fn new() -> Cache {
        Cache([const { [const { AtomicPtr::new(ptr::null_mut()) }; ENTRIES] }; CLASSES])
    }
}

static CACHES: [Cache; MAX_VCPUS] = [const { Cache::new() }; MAX_VCPUS];

/// This vCPU's entries for `class` (another vCPU's if the code moved meanwhile: still correct).
#[inline]
fn entries(class: Class) -> &'static [AtomicPtr<u8>; ENTRIES] {
    let vcpu = (crate::vcpu_id() as usize).min(MAX_VCPUS - 1);
    &CACHES[vcpu].0[class.0 as usize]
}

/// A cached block of `class`, if this vCPU has one (the newest first).
#[inline]
pub(super) fn take(class: Class) -> Option<*mut u8> {
    entries(class).iter().rev().find_map(|e| {
        if e.load(Ordering::Relaxed).is_null() {
            return None;
        }
        let block = e.swap(ptr::null_mut(), Ordering::Acquire);
        (!block.is_null()).then_some(block)
    })
}

/// Keeps `block` (of `class`, no longer used) for the next allocation; false if full.
#[inline]
pub(super) fn put(class: Class, block: NonNull<u8>) -> bool {
    entries(class).iter().any(|e| {
        e.load(Ordering::Relaxed).is_null()
            && e.compare_exchange(
                ptr::null_mut(),
                block.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    })
}
