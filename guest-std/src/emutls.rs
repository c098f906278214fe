//! Thread-locals: `__emutls_get_address`, which the std targets' emulated TLS model
//! (`"tls-model": "emulated"` in `x86_64-activm-std` and `aarch64-activm-std`) calls for every
//! `#[thread_local]` access in std and the program.
//!
//! Native TLS on x86_64 would need `%fs` to follow each user thread from vCPU to vCPU, and CPL3
//! cannot set `%fs` here (no FSGSBASE; `wrmsr` is CPL0, emulated and slow). On aarch64 EL0 can
//! write TPIDR_EL0, and activm-rt already carries it with each thread; the target still uses
//! emulated TLS there, so both architectures share this one path (native TLS would also need
//! a per-thread TLS block laid out from the image's PT_TLS segment). With emulated TLS, LLVM
//! gives each thread-local a control block ([`Control`], layout as compiler-rt's
//! `__emutls_control`) and asks for the calling thread's copy by address. This module keeps the
//! copies in one table per thread control block, in activm-rt's spare word of the TCB: made on
//! a TCB's first use and kept when the TCB is pooled, so a spawn reuses the table of a finished
//! thread. When a thread with another id first asks, every copy the table holds is set back to
//! its variable's initial value (std has run its own TLS destructors by then) and keeps its
//! place: the new thread's accesses then all take the fast path (a std spawn+join makes ~22
//! accesses to ~8 variables), and a spawn allocates nothing here. The copies in the table's
//! own chunk (all of std's) are set back by one copy of an image of their initial values kept
//! beside them, not one template copy per variable (~8 calls to `memcpy`, ~60 ns a spawn).
//!
//! The fast path ([`__emutls_get_address`]: variable indexed, table of the running thread,
//! copy made) is a few loads and compares without a stack frame; the rest is out of line.

use alloc::alloc::{alloc, handle_alloc_error};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::alloc::Layout;
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

impl Control {
    /// Writes the variable's initial value to `ptr`.
    ///
    /// # Safety
    /// `ptr` has room for `size` bytes, aligned to `align`, that nobody else uses.
    unsafe fn init(&self, ptr: *mut u8) {
        // SAFETY: `ptr` has room for `size` bytes (the caller's contract); LLVM's template
        // holds `size` bytes.
        unsafe {
            if self.template.is_null() {
                core::ptr::write_bytes(ptr, 0, self.size);
            } else {
                core::ptr::copy_nonoverlapping(self.template, ptr, self.size);
            }
        }
    }
}

/// Indices handed out so far.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(1);

/// A thread's small copies are carved from chunks of this size, the first of which lives in
/// the thread's table itself (so one allocation covers the table, the index and all of std's
/// thread-locals); bigger or more aligned ones get their own block.
const CHUNK: usize = 512;
const CHUNK_ALIGN: usize = 64;
/// Variables whose address slots live in the table itself (std has about a dozen).
const INLINE: usize = 32;

/// Left uninitialised: only the part handed out (and then written from a template) is read.
#[repr(C, align(64))]
struct Chunk(core::mem::MaybeUninit<[u8; CHUNK]>);

impl core::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Chunk")
    }
}

/// One TCB's copies: addresses by index, the copies made outside the first chunk (to reset for
/// the next thread), the first chunk and the image of its copies' initial values. It is boxed,
/// kept with its TCB for good and never moves, so the chunk's address is stable. Copies are
/// never freed: a reused table resets and reuses them.
#[derive(Debug)]
struct Copies {
    /// The thread whose copies these are (activm-rt's thread id; never reused).
    owner: u64,
    first: [*mut u8; INLINE],
    more: Vec<*mut u8>,
    /// Every copy made outside the first chunk, with its variable.
    made: Vec<(*const Control, *mut u8)>,
    /// Free part of the current chunk (`end == 0`: the first chunk is not in use yet).
    next: usize,
    end: usize,
    /// Bytes of the first chunk in use (its copies and the padding between them).
    used: usize,
    chunk: Chunk,
    /// The initial values of the first chunk's copies, at the same offsets (`used` bytes).
    image: Chunk,
}

impl Copies {
    fn new(owner: u64) -> Copies {
        Copies {
            owner,
            first: [core::ptr::null_mut(); INLINE],
            more: Vec::new(),
            made: Vec::new(),
            next: 0,
            end: 0,
            used: 0,
            chunk: Chunk(core::mem::MaybeUninit::uninit()),
            image: Chunk(core::mem::MaybeUninit::uninit()),
        }
    }

    /// Hands the copies of a finished thread (std ran their destructors) to thread `owner`,
    /// each set back to its initial value.
    fn reuse(&mut self, owner: u64) {
        // SAFETY: the first `used` bytes of the image are initialised (`create` writes each
        // copy's initial value there, and the padding between copies as zeroes); the chunk has
        // room for them; the thread that used the copies has finished, the new one has not run.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.image.0.as_ptr() as *const u8,
                self.chunk.0.as_mut_ptr() as *mut u8,
                self.used,
            )
        };
        for &(control, ptr) in &self.made {
            // SAFETY: `control` is LLVM's (static) control block of the variable `ptr` is a
            // copy of, made by `create` with its size and alignment; the thread that used it
            // has finished and the new one has not run yet.
            unsafe { (*control).init(ptr) };
        }
        self.owner = owner;
    }

    /// The address slot of variable `i`.
    fn slot(&mut self, i: usize) -> &mut *mut u8 {
        if i < INLINE {
            return &mut self.first[i];
        }
        let j = i - INLINE;
        if j >= self.more.len() {
            let known = NEXT_INDEX.load(Ordering::Relaxed).max(i + 1) - INLINE;
            self.more.resize(known, core::ptr::null_mut());
        }
        &mut self.more[j]
    }

    fn block(&mut self, layout: Layout) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        ptr
    }

    /// Room for a copy of `control`'s variable.
    fn room(&mut self, size: usize, align: usize) -> *mut u8 {
        let Ok(layout) = Layout::from_size_align(size.max(1), align.max(1)) else {
            activm_rt::println!("activm-std: bad thread-local layout");
            activm_stub::exit(134)
        };
        if layout.size() > CHUNK / 4 || layout.align() > CHUNK_ALIGN {
            return self.block(layout);
        }
        if self.end == 0 {
            self.next = self.chunk.0.as_mut_ptr() as usize;
            self.end = self.next + CHUNK;
        }
        let start = self.next.next_multiple_of(layout.align());
        if start + layout.size() > self.end {
            let chunk = Layout::from_size_align(CHUNK, CHUNK_ALIGN).expect("chunk layout");
            self.next = self.block(chunk) as usize;
            self.end = self.next + CHUNK;
            return self.room(size, align);
        }
        self.next = start + layout.size();
        start as *mut u8
    }

    /// A new copy of `control`'s variable, initialised from its template.
    fn create(&mut self, control: &'static Control) -> *mut u8 {
        let ptr = self.room(control.size, control.align);
        // SAFETY: `room` gave `ptr` room for `size` bytes, used by nothing else.
        unsafe { control.init(ptr) };
        let base = self.chunk.0.as_ptr() as usize;
        let offset = (ptr as usize).wrapping_sub(base);
        if offset < CHUNK {
            // In the first chunk: its initial value joins the image, at the same offset, and
            // the padding before it is zeroed there (`reuse` copies the image's `used` bytes).
            let end = offset + control.size;
            let image = self.image.0.as_mut_ptr() as *mut u8;
            // SAFETY: `used <= offset` (copies are carved in order) and `end <= CHUNK`: both
            // ranges are inside the image; `ptr` holds `size` initialised bytes.
            unsafe {
                core::ptr::write_bytes(image.add(self.used), 0, offset - self.used);
                core::ptr::copy_nonoverlapping(ptr, image.add(offset), control.size);
            }
            self.used = end;
        } else {
            self.made.push((control, ptr));
        }
        ptr
    }
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

/// The calling thread's table: its TCB's, made on the TCB's first use, reset when it last
/// served another thread.
fn copies() -> &'static mut Copies {
    let (word, id) = activm_rt::thread::spare_word();
    let mut table = word.get() as *mut Copies;
    if table.is_null() {
        table = Box::into_raw(Box::new(Copies::new(id)));
        word.set(table as *mut u8);
    }
    // SAFETY: only this module writes the spare word, always a leaked `Copies`; a TCB runs one
    // thread at a time and only that thread calls here, so nothing else borrows the table
    // (nothing below re-enters: the heap uses no thread-locals).
    let copies = unsafe { &mut *table };
    if copies.owner != id {
        copies.reuse(id);
    }
    copies
}

/// `void *__emutls_get_address(__emutls_control *)`: the calling thread's copy of a
/// thread-local variable.
///
/// # Safety
/// `control` is a control block LLVM emitted for an emulated thread-local.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __emutls_get_address(control: *mut Control) -> *mut u8 {
    // SAFETY: the caller passes LLVM's control block, which lives for the whole program.
    let control: &'static Control = unsafe { &*control };
    let i = control.index.load(Ordering::Acquire);
    let (word, id) = activm_rt::thread::spare_word();
    let table = word.get() as *const Copies;
    if i != 0 && i <= INLINE && !table.is_null() {
        // SAFETY: a non-null spare word is this module's leaked `Copies` (see `copies`), only
        // used by the thread running on its TCB, which is us; this reads two fields.
        let (owner, ptr) = unsafe { ((*table).owner, (*table).first[i - 1]) };
        if owner == id && !ptr.is_null() {
            return ptr;
        }
    }
    lookup_or_create(control)
}

/// The rest of [`__emutls_get_address`]: a new variable, table or thread, or a copy not made
/// yet.
#[cold]
#[inline(never)]
fn lookup_or_create(control: &'static Control) -> *mut u8 {
    let i = index(control);
    let copies = copies();
    let ptr = *copies.slot(i);
    if !ptr.is_null() {
        return ptr;
    }
    let ptr = copies.create(control);
    *copies.slot(i) = ptr;
    ptr
}
