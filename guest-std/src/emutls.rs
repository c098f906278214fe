//! Thread-locals: `__emutls_get_address`, which the `x86_64-activm-std` target's emulated TLS
//! model (`"tls-model": "emulated"`) calls for every `#[thread_local]` access in std and the
//! program.
//!
//! Native TLS would need `%fs` to follow each user thread from vCPU to vCPU, and CPL3 cannot
//! set `%fs` here (no FSGSBASE; `wrmsr` is CPL0, emulated and slow). With emulated TLS, LLVM
//! gives each thread-local a control block ([`Control`], layout as compiler-rt's
//! `__emutls_control`) and asks for the calling thread's copy by address; this module keeps the
//! copies in one activm-rt thread-local table, created on first use from the variable's
//! template and freed when the thread exits (after std's own TLS destructors have run).

use alloc::alloc::{alloc, alloc_zeroed, dealloc, handle_alloc_error};
use alloc::vec::Vec;
use core::alloc::Layout;
use core::cell::RefCell;
use core::sync::atomic::{AtomicUsize, Ordering};

/// LLVM's (and compiler-rt's) `__emutls_control`, one per thread-local variable.
#[repr(C)]
#[derive(Debug)]
pub struct Control {
    size: usize,
    align: usize,
    /// This variable's index in every thread's table, +1 (0: not assigned yet).
    index: AtomicUsize,
    /// The initial value (`size` bytes), or null for all zeroes.
    template: *const u8,
}

/// Indices handed out so far.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(1);

/// One thread's copies: `(address, layout)` by index.
#[derive(Debug, Default)]
struct Copies(Vec<Option<(*mut u8, Layout)>>);

impl Drop for Copies {
    fn drop(&mut self) {
        for (ptr, layout) in self.0.drain(..).flatten() {
            // SAFETY: allocated in `create` with this layout, owned by this table only.
            unsafe { dealloc(ptr, layout) };
        }
    }
}

activm_rt::thread_local! {
    static COPIES: RefCell<Copies> = RefCell::new(Copies::default());
}

fn index(control: &Control) -> usize {
    let i = control.index.load(Ordering::Acquire);
    if i != 0 {
        return i - 1;
    }
    let new = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
    match control
        .index
        .compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => new - 1,
        Err(other) => other - 1,
    }
}

/// A new copy of `control`'s variable, initialised from its template.
fn create(control: &Control) -> (*mut u8, Layout) {
    let Ok(layout) = Layout::from_size_align(control.size.max(1), control.align.max(1)) else {
        activm_rt::println!("activm-std: bad thread-local layout");
        activm_stub::exit(134)
    };
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe {
        if control.template.is_null() {
            alloc_zeroed(layout)
        } else {
            alloc(layout)
        }
    };
    if ptr.is_null() {
        handle_alloc_error(layout);
    }
    if !control.template.is_null() {
        // SAFETY: LLVM's template holds `size` bytes; `ptr` has room for them.
        unsafe { core::ptr::copy_nonoverlapping(control.template, ptr, control.size) };
    }
    (ptr, layout)
}

/// `void *__emutls_get_address(__emutls_control *)`: the calling thread's copy of a
/// thread-local variable.
///
/// # Safety
/// `control` is a control block LLVM emitted for an emulated thread-local.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __emutls_get_address(control: *mut Control) -> *mut u8 {
    // SAFETY: the caller passes LLVM's control block, which lives for the whole program.
    let control = unsafe { &*control };
    let i = index(control);
    let found = COPIES.try_with(|copies| {
        let mut copies = copies.borrow_mut();
        if i >= copies.0.len() {
            copies.0.resize(i + 1, None);
        }
        match copies.0[i] {
            Some((ptr, _)) => ptr,
            None => {
                let copy = create(control);
                copies.0[i] = Some(copy);
                copy.0
            }
        }
    });
    match found {
        Ok(ptr) => ptr,
        Err(_) => {
            activm_rt::println!("activm-std: thread-local used after its thread's table was freed");
            activm_stub::exit(134)
        }
    }
}
