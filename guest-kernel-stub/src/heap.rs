//! The guest heap: a `talc::Talc` over `[BootInfo.heap_start, heap_end)` behind a [`SpinLock`]
//! (which holds off preemption while held, so a thread is never switched out inside the
//! allocator), initialised by vCPU 0 while the others wait.
//!
//! Talc keeps its free chunks in size bins, so an allocation or a free costs the same with ten
//! or a million blocks live. (The first-fit linked list used before walked every free fragment:
//! spawning and joining N threads cost O(N^2), 7.6 s for 100,000 threads.)
//!
//! Small blocks (up to [`MAX_SMALL`] bytes, alignment up to 16) are rounded up to a power of
//! two and kept, when freed, in a small cache per vCPU and size ([`small`]) that the next
//! allocation of that size on that vCPU takes without the lock: a std thread's spawn and join
//! allocate and free five such blocks. Under the thread runtime the caches are restartable
//! sequences without a locked instruction ([`use_restartable_caches`]).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use talc::{ErrOnOom, Span, Talc};

use crate::sync::SpinLock;

mod sequences;
pub(crate) mod small;

pub use small::MAX_SMALL;

struct GuestHeap(SpinLock<Talc<ErrOnOom>>);

impl GuestHeap {
    /// From talc, under the lock.
    fn alloc_locked(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size (every caller's contract).
        unsafe { self.0.lock().malloc(layout) }.map_or(core::ptr::null_mut(), NonNull::as_ptr)
    }

    /// Back to talc, under the lock.
    ///
    /// # Safety
    /// `ptr` is a block talc returned with this layout.
    unsafe fn free_locked(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's contract.
        unsafe { self.0.lock().free(ptr, layout) };
    }
}

// SAFETY: every access to talc goes through the lock; `Talc` hands out disjoint blocks; a block
// in a per-vCPU cache belongs to that cache alone (each entry is taken and filled atomically,
// `small`) until an allocation takes it.
unsafe impl GlobalAlloc for GuestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match small::class(layout) {
            Some(class) => small::take(class).unwrap_or_else(|| self.alloc_locked(class.layout())),
            None => self.alloc_locked(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(ptr) = NonNull::new(ptr) else {
            return;
        };
        match small::class(layout) {
            Some(class) => {
                if !small::put(class, ptr) {
                    // SAFETY: small blocks come from talc with their class's layout.
                    unsafe { self.free_locked(ptr, class.layout()) };
                }
            }
            // SAFETY: the caller passes a block this allocator returned with this layout.
            None => unsafe { self.free_locked(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(old) = NonNull::new(ptr) else {
            return core::ptr::null_mut();
        };
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return core::ptr::null_mut();
        };
        let (old_class, new_class) = (small::class(layout), small::class(new_layout));
        if old_class.is_some() || new_class.is_some() {
            if old_class == new_class {
                // The block already is its class's size.
                return ptr;
            }
            // SAFETY: the caller's block and new layout (GlobalAlloc's contract).
            return unsafe { self.move_block(ptr, layout, new_layout) };
        }
        if new_size <= layout.size() {
            // SAFETY: `old` is a block of `layout` from this heap, `new_size` is not larger.
            unsafe { self.0.lock().shrink(old, layout, new_size) };
            return ptr;
        }
        // Grow in place when the next chunk is free, else allocate, copy and free with the
        // lock dropped in between (nothing is copied under it).
        // SAFETY: as above, `new_size` is larger.
        if let Ok(grown) = unsafe { self.0.lock().grow_in_place(old, layout, new_size) } {
            return grown.as_ptr();
        }
        // SAFETY: the caller's block and new layout.
        unsafe { self.move_block(ptr, layout, new_layout) }
    }
}

impl GuestHeap {
    /// `realloc` by a new block, a copy and a free (nothing is copied under the lock).
    ///
    /// # Safety
    /// `ptr` is a live block of `layout` from this heap; `new_layout` has a non-zero size.
    unsafe fn move_block(&self, ptr: *mut u8, layout: Layout, new_layout: Layout) -> *mut u8 {
        // SAFETY: `new_layout` has a non-zero size.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least the smaller size long.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_layout.size()));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: GuestHeap = GuestHeap(SpinLock::new(Talc::new(ErrOnOom)));

static READY: AtomicBool = AtomicBool::new(false);

/// Hands `[start, end)` to the allocator and releases the waiting vCPUs.
///
/// # Safety
/// Called once; `[start, end)` is free RAM nothing else uses, mapped read-write for CPL3.
pub(crate) unsafe fn init(start: u64, end: u64) {
    if end > start {
        let span = Span::new(start as *mut u8, end as *mut u8);
        // SAFETY: the caller guarantees the range is unused RAM. A range too small to hold
        // Talc's bookkeeping is refused, which leaves an empty heap (allocations fail).
        let _ = unsafe { ALLOCATOR.0.lock().claim(span) };
    }
    READY.store(true, Ordering::Release);
}

/// Spins at CPL3 until vCPU 0 has initialised the heap.
pub(crate) fn wait_ready() {
    while !READY.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
}

/// Switches the caches of small blocks to restartable sequences (no locked instruction per
/// allocation or free; see `small`).
///
/// # Safety
/// From now on, every interrupt handler and every resumption of a context the VMM handed over
/// first rewinds an instruction pointer inside one of the heap's restartable sequences
/// (`__stub_rseq_heap_take_start..__stub_rseq_heap_take_end`, and the same for `put`) to its
/// start: the thread runtime lists them in its restartable-sequence table.
pub unsafe fn use_restartable_caches() {
    // SAFETY: the caller's contract.
    unsafe { small::use_restartable() };
}

/// The `[start, end)` ranges of the heap's restartable sequences (for tests of the runtime's
/// table).
pub fn restartable_sequences() -> [(u64, u64); 2] {
    sequences::sequences()
}

/// Bytes currently allocated (blocks kept in the per-vCPU caches of small blocks count as
/// allocated: at most [`MAX_SMALL`] times a few dozen per vCPU).
pub fn used() -> usize {
    ALLOCATOR.0.lock().get_counters().allocated_bytes
}

/// Bytes currently free.
pub fn free() -> usize {
    ALLOCATOR.0.lock().get_counters().available_bytes
}
