//! Per-vCPU caches of small heap blocks: a freed block of up to [`MAX_SMALL`] bytes goes to the
//! freeing vCPU's cache for its size class (16, 32, ... 256 bytes) when there is room, and the
//! next allocation of that class on that vCPU takes it, with no lock and no walk of talc's bins.
//!
//! Code the VMM takes away in the middle of a cache operation goes on from another vCPU while
//! this vCPU's next activation uses the same cache, and a cache must never hand one block to two
//! owners. Two ways, the same caches' sizes:
//!
//! * **Restartable** (once the thread runtime calls `use_restartable_caches`): a stack of blocks
//!   per class and vCPU, pushed and popped by two restartable sequences (`arch::*::heap`, called
//!   through `heap::sequences`) that commit with one plain store of the stack's length; the
//!   runtime rewinds an interrupted or handed-over sequence to its start, so it runs again on
//!   whatever vCPU it is then on. No locked instruction: a malloc+free of a small block costs a
//!   few nanoseconds instead of two atomic read-modify-writes (~8 ns each on the development
//!   host; a std spawn+join allocates and frees five blocks).
//! * **Atomic** (before that, and in guests without the runtime): each cache entry is taken and
//!   filled by one atomic operation (swap, compare-exchange), never by a count changed in a
//!   separate step. Blocks left here when the restartable stacks take over are still found on a
//!   miss.
//!
//! Neither needs a preemption hold.

use core::alloc::Layout;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

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
pub(crate) const ENTRIES: usize = 8;

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

/// One vCPU's stacks for the restartable path: `len[c]` blocks of class `c` in
/// `blocks[c][..len[c]]`. Only this vCPU's restartable sequences touch them (plain accesses; the
/// atomic types only make the static shareable).
#[repr(C, align(512))]
pub(crate) struct Stacks {
    pub(crate) blocks: [[AtomicPtr<u8>; ENTRIES]; CLASSES],
    pub(crate) len: [AtomicU64; CLASSES],
}

/// log2 of a vCPU's [`Stacks`] (the sequences index [`STACKS`] with a shift).
pub(crate) const STACKS_SHIFT: u32 = core::mem::size_of::<Stacks>().trailing_zeros();
const _: () = assert!(1 << STACKS_SHIFT == core::mem::size_of::<Stacks>());

pub(crate) static STACKS: [Stacks; MAX_VCPUS] = [const {
    Stacks {
        blocks: [const { [const { AtomicPtr::new(ptr::null_mut()) }; ENTRIES] }; CLASSES],
        len: [const { AtomicU64::new(0) }; CLASSES],
    }
}; MAX_VCPUS];

/// Whether the restartable stacks are in use.
static RESTARTABLE: AtomicBool = AtomicBool::new(false);

/// Switches to the restartable stacks.
///
/// # Safety
/// From now on, every interrupt handler and every resumption of a context the VMM handed over
/// rewinds an instruction pointer inside `__stub_rseq_heap_take_start..__stub_rseq_heap_take_end`
/// or `__stub_rseq_heap_put_start..__stub_rseq_heap_put_end` to the range's start.
pub(crate) unsafe fn use_restartable() {
    RESTARTABLE.store(true, Ordering::Release);
}

/// This vCPU's entries for `class` (another vCPU's if the code moved meanwhile: still correct).
#[inline]
fn entries(class: Class) -> &'static [AtomicPtr<u8>; ENTRIES] {
    let vcpu = (crate::vcpu_id() as usize).min(MAX_VCPUS - 1);
    &CACHES[vcpu].0[class.0 as usize]
}

/// A cached block of `class`, if this vCPU has one (the newest first).
#[inline]
pub(super) fn take(class: Class) -> Option<*mut u8> {
    if RESTARTABLE.load(Ordering::Relaxed) {
        // SAFETY: a valid class; `use_restartable`'s caller rewinds the sequences.
        let block = unsafe { super::sequences::take(class.0 as usize) };
        if !block.is_null() {
            return Some(block);
        }
    }
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
    if RESTARTABLE.load(Ordering::Relaxed) {
        // SAFETY: a valid class and a free block of it, ours; the sequences are rewound.
        return unsafe { super::sequences::put(class.0 as usize, block.as_ptr()) };
    }
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
