//! The guest heap: a `linked_list_allocator::Heap` over `[BootInfo.heap_start, heap_end)` behind
//! a [`SpinLock`] (which holds off preemption while held, so a thread is never switched out
//! inside the allocator), initialised by vCPU 0 while the others wait.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use linked_list_allocator::Heap;

use crate::sync::SpinLock;

struct GuestHeap(SpinLock<Heap>);

// SAFETY: every access to the heap goes through the lock; `Heap` hands out disjoint blocks.
unsafe impl GlobalAlloc for GuestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0
            .lock()
            .allocate_first_fit(layout)
            .map_or(core::ptr::null_mut(), NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(ptr) = NonNull::new(ptr) {
            // SAFETY: the caller passes a block this allocator returned with this layout.
            unsafe { self.0.lock().deallocate(ptr, layout) };
        }
    }
}

#[global_allocator]
static ALLOCATOR: GuestHeap = GuestHeap(SpinLock::new(Heap::empty()));

static READY: AtomicBool = AtomicBool::new(false);

/// Hands `[start, end)` to the allocator and releases the waiting vCPUs.
///
/// # Safety
/// Called once; `[start, end)` is free RAM nothing else uses, mapped read-write for CPL3.
pub(crate) unsafe fn init(start: u64, end: u64) {
    if end > start {
        // SAFETY: the caller guarantees the range is unused RAM.
        unsafe {
            ALLOCATOR
                .0
                .lock()
                .init(start as *mut u8, (end - start) as usize)
        };
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
    ALLOCATOR.0.lock().used()
}

/// Bytes currently free.
pub fn free() -> usize {
    ALLOCATOR.0.lock().free()
}
