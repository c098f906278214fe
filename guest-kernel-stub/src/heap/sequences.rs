//! The arch-neutral side of the heap's restartable sequences: each architecture's
//! `arch/*/heap.rs` defines `__stub_heap_take` and `__stub_heap_put` (and the `[start, end)`
//! symbols the runtime rewinds) in assembly; this is how the heap calls them.

use core::ptr::addr_of;

extern "C" {
    fn __stub_heap_take(class: usize) -> *mut u8;
    fn __stub_heap_put(class: usize, block: *mut u8) -> bool;
    static __stub_rseq_heap_take_start: u8;
    static __stub_rseq_heap_take_end: u8;
    static __stub_rseq_heap_put_start: u8;
    static __stub_rseq_heap_put_end: u8;
}

/// The sequences' `[start, end)` ranges.
pub(crate) fn sequences() -> [(u64, u64); 2] {
    let take = (
        addr_of!(__stub_rseq_heap_take_start),
        addr_of!(__stub_rseq_heap_take_end),
    );
    let put = (
        addr_of!(__stub_rseq_heap_put_start),
        addr_of!(__stub_rseq_heap_put_end),
    );
    [take, put].map(|(start, end)| (start as u64, end as u64))
}

/// A block of class `class` from this vCPU's stack, or null.
///
/// # Safety
/// `class` is a valid class index; the restartable sequences are rewound (see the module).
#[inline(always)]
pub(crate) unsafe fn take(class: usize) -> *mut u8 {
    // SAFETY: the caller's contract; the sequence only touches this vCPU's stacks.
    unsafe { __stub_heap_take(class) }
}

/// Pushes `block` on this vCPU's stack of class `class`; false if it is full.
///
/// # Safety
/// As [`take`]; `block` is a free block of that class, owned by the caller.
#[inline(always)]
pub(crate) unsafe fn put(class: usize, block: *mut u8) -> bool {
    // SAFETY: the caller's contract.
    unsafe { __stub_heap_put(class, block) }
}
