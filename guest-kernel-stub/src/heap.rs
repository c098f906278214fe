//! The guest heap: a `linked_list_allocator` over `[BootInfo.heap_start, heap_end)`,
//! initialised by vCPU 0 while the others wait.

use core::sync::atomic::{AtomicBool, Ordering};

use linked_list_allocator::LockedHeap;

#[global_allocator]
static ALLOCATOR: LockedHeap = LockedHeap::empty();

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
    ALLOCATOR.lock().used()
}

/// Bytes currently free.
pub fn free() -> usize {
    ALLOCATOR.lock().free()
}
