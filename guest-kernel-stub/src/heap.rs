//! The guest heap: a `talc::Talc` over `[BootInfo.heap_start, heap_end)` behind a [`SpinLock`]
//! (which holds off preemption while held, so a thread is never switched out inside the
//! allocator), initialised by vCPU 0 while the others wait.
//!
//! Talc keeps its free chunks in size bins, so an allocation or a free costs the same with ten
//! or a million blocks live. (The first-fit linked list used before walked every free fragment:
//! spawning and joining N threads cost O(N^2), 7.6 s for 100,000 threads.)

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use talc::{ErrOnOom, Span, Talc};

use crate::sync::SpinLock;

struct GuestHeap(SpinLock<Talc<ErrOnOom>>);

// SAFETY: every access to the heap goes through the lock; `Talc` hands out disjoint blocks.
unsafe impl GlobalAlloc for GuestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size (GlobalAlloc's contract).
        unsafe { self.0.lock().malloc(layout) }.map_or(core::ptr::null_mut(), NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(ptr) = NonNull::new(ptr) {
            // SAFETY: the caller passes a block this allocator returned with this layout.
            unsafe { self.0.lock().free(ptr, layout) };
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(old) = NonNull::new(ptr) else {
            return core::ptr::null_mut();
        };
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
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return core::ptr::null_mut();
        };
        // SAFETY: `new_layout` has a non-zero size.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least `layout.size()` bytes long.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size());
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

/// Bytes currently allocated.
pub fn used() -> usize {
    ALLOCATOR.0.lock().get_counters().allocated_bytes
}

/// Bytes currently free.
pub fn free() -> usize {
    ALLOCATOR.0.lock().get_counters().available_bytes
}
