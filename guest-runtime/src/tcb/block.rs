//! The thread control block ([`Tcb`]): its fields and who owns them, the waiting states, the
//! packet, the event history. Allocating one is the pool's work (`tcb.rs`); the run queues
//! (`percpu.rs`) hold these, so nothing here reaches above.
//!
//! **Ownership of the non-atomic fields.** `sp` and `stack` belong to whoever runs the thread or
//! holds it while it does not run (a run queue, the scheduler that pops it); the packet belongs
//! to the thread until it exits, then to the joiner; `link` and `tag` belong to the queue the
//! thread waits in (under that queue's lock). No two parties ever touch them at once.
//!
//! **Waiting** ([`Tcb::prepare_wait`], [`wait`], [`Tcb::wake`]) is one-shot and uses one word:
//! the waiter sets `WAITING` before it makes itself findable, then switches out with the PARK
//! action; the scheduler, once the thread is fully saved, moves `WAITING` to `PARKED` by CAS
//! (failing means a waker came first: the thread is queued again at once). A waker swaps in
//! `WOKEN` and, only if it saw `PARKED`, makes the thread runnable. After its swap a waker never
//! touches the TCB again, so the waiter may run, exit and be recycled at once.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::stack::region::Stack;

/// `Tcb::wake` states.
pub const WAITING: u32 = 0;
pub const WOKEN: u32 = 1;
pub const PARKED: u32 = 2;

/// `Tcb::token` states (the std-style `park`/`unpark` token).
pub const TOKEN_EMPTY: u32 = 0;
pub const TOKEN_NOTIFIED: u32 = 1;
pub const TOKEN_PARKED: u32 = 2;

/// `Tcb::join`: the thread runs; it finished; otherwise the address of the waiting joiner.
pub const JOIN_RUNNING: usize = 0;
pub const JOIN_FINISHED: usize = 1;

/// `Tcb::flags`.
pub const FLAG_MAIN: u32 = 1 << 0;
/// Blocked in the VMM (a BLOCKED record named its activation).
pub const FLAG_BLOCKED_IN_VMM: u32 = 1 << 1;

/// Bytes of closure/result stored in the TCB itself (bigger ones go to the heap). 64 covers a
/// closure that captures a few `Arc`s and numbers; with [`HISTORY`] it keeps the TCB at five
/// cache lines (320 bytes, 448 before): a million live threads are that much fresh memory,
/// whose first touch is most of their cost (`docs/runtime.md`, "Scale").
pub const INLINE_PACKET: usize = 64;

/// What a thread runs: called once on the thread with its TCB.
pub type RunFn = unsafe fn(&Tcb);
/// Drops a result nobody joined.
pub type DropFn = unsafe fn(*mut u8);

/// Thread-local values of one thread: `(value, destructor)` by key index.
pub type TlsSlots = Vec<Option<(*mut u8, unsafe fn(*mut u8))>>;

/// A thread control block. The first field is the saved stack pointer (the assembly uses it).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Tcb {
    /// Saved stack pointer, at offset 0.
    pub sp: UnsafeCell<usize>,
    pub id: Cell<u64>,
    pub refs: AtomicU32,
    pub wake: AtomicU32,
    pub token: AtomicU32,
    pub flags: AtomicU32,
    pub join: AtomicUsize,
    /// TSC when it was last switched in (time slices).
    pub slice_start: AtomicU64,
    /// Intrusive link for the queue the thread is in (global run queue, a wait queue).
    pub link: Cell<*const Tcb>,
    /// What the thread waits for, for queues that care (readers/writers, channel slots).
    pub tag: Cell<usize>,
    pub name: UnsafeCell<Option<Arc<str>>>,
    /// Its stack; `None` until it first runs (stacks are bound lazily).
    pub stack: Cell<Option<Stack>>,
    /// Requested stack size (0: the default slot size).
    pub stack_size: Cell<usize>,
    pub run: Cell<Option<RunFn>>,
    pub drop_result: Cell<Option<DropFn>>,
    /// The packet (closure, then result) if it did not fit inline.
    pub packet_heap: Cell<*mut u8>,
    pub packet_layout: Cell<Option<Layout>>,
    pub packet: UnsafeCell<MaybeUninit<[u128; INLINE_PACKET / 16]>>,
    pub tls: UnsafeCell<TlsSlots>,
    /// The activation this thread was running on when it blocked in the VMM.
    pub blocked_activation: AtomicU32,
    /// Diagnostics: the last scheduling event (`EV_*` << 8 | vCPU).
    pub last_event: AtomicU32,
    /// Diagnostics: the last [`HISTORY`] events, a ring indexed by `history_at`.
    pub history: [AtomicU32; HISTORY],
    pub history_at: AtomicU32,
    /// Link in the list of every TCB (diagnostics; TCBs are never freed).
    pub all_next: Cell<*const Tcb>,
    /// Sleeping: the deadline (TSC) and the link in the sleepers' list.
    pub sleep_deadline: Cell<u64>,
    pub sleep_next: Cell<*const Tcb>,
    /// A timed wait (`timer::TIMED_*`): who of the timer and a notifier claimed the wake-up.
    pub timed: AtomicU32,
    /// A word for a layer above the runtime ([`crate::thread::spare_word`]): never read nor
    /// cleared here, so it stays with the TCB through the pool.
    pub spare: Cell<*mut u8>,
}

// Every live thread costs a TCB of fresh memory at scale: keep it at five cache lines.
const _: () = assert!(
    core::mem::size_of::<Tcb>() <= 320,
    "the TCB grew past five cache lines"
);

/// `Tcb::last_event` kinds.
pub const EV_SPAWNED: u32 = 1;
pub const EV_QUEUED: u32 = 2;
pub const EV_RUNNING: u32 = 3;
pub const EV_PARKED: u32 = 4;
pub const EV_RESUMED: u32 = 5;
pub const EV_CONTINUED: u32 = 6;
pub const EV_EXITED: u32 = 7;
pub const EV_GLOBAL: u32 = 8;
pub const EV_NEXT: u32 = 9;

/// The name of an event as `Tcb::last_event` stores it (`EV_*` << 8 | vCPU); the names are the
/// ones the VMM's hang report uses (`protocol::diag::EVENT_NAMES`).
pub fn event_name(e: u32) -> &'static str {
    activm_stub::protocol::diag::EVENT_NAMES
        .get((e >> 8) as usize)
        .copied()
        .unwrap_or("?")
}

/// Events kept per thread (diagnostics).
pub const HISTORY: usize = 4;

/// Records a scheduling event of `t` on this vCPU (diagnostics, see `stats::dump`).
#[inline(always)]
pub fn event(t: &Tcb, ev: u32) {
    let e = (ev << 8) | activm_stub::vcpu_id();
    t.last_event.store(e, Ordering::Relaxed);
    // Not a locked increment (this is on every switch): two racing events may share a slot.
    let at = t.history_at.load(Ordering::Relaxed);
    t.history_at.store(at.wrapping_add(1), Ordering::Relaxed);
    t.history[at as usize % HISTORY].store(e, Ordering::Relaxed);
}

/// `t`'s last events, oldest first, as text (diagnostics).
pub fn history(t: &Tcb) -> alloc::string::String {
    let at = t.history_at.load(Ordering::Relaxed) as usize;
    let mut out = alloc::string::String::new();
    for i in at.saturating_sub(HISTORY)..at {
        let e = t.history[i % HISTORY].load(Ordering::Relaxed);
        let name = event_name(e);
        out += &alloc::format!("{name}@{} ", e & 0xff);
    }
    out
}
// SAFETY: the atomic fields are shared; every other field follows the ownership rules of the
// module documentation, so no two threads access one at the same time.
unsafe impl Sync for Tcb {}
// SAFETY: as above.
unsafe impl Send for Tcb {}
impl Tcb {
    /// A blank block (the pool leaks it and sets it up).
    pub(super) fn new() -> Tcb {
        Tcb {
            sp: UnsafeCell::new(0),
            id: Cell::new(0),
            refs: AtomicU32::new(0),
            wake: AtomicU32::new(WOKEN),
            token: AtomicU32::new(TOKEN_EMPTY),
            flags: AtomicU32::new(0),
            join: AtomicUsize::new(JOIN_RUNNING),
            slice_start: AtomicU64::new(0),
            link: Cell::new(ptr::null()),
            tag: Cell::new(0),
            name: UnsafeCell::new(None),
            stack: Cell::new(None),
            stack_size: Cell::new(0),
            run: Cell::new(None),
            drop_result: Cell::new(None),
            packet_heap: Cell::new(ptr::null_mut()),
            packet_layout: Cell::new(None),
            packet: UnsafeCell::new(MaybeUninit::uninit()),
            tls: UnsafeCell::new(Vec::new()),
            blocked_activation: AtomicU32::new(0),
            last_event: AtomicU32::new(0),
            history: [const { AtomicU32::new(0) }; HISTORY],
            history_at: AtomicU32::new(0),
            all_next: Cell::new(ptr::null()),
            sleep_deadline: Cell::new(0),
            sleep_next: Cell::new(ptr::null()),
            timed: AtomicU32::new(0),
            spare: Cell::new(ptr::null_mut()),
        }
    }

    /// The thread's name.
    pub fn name(&self) -> Option<&str> {
        // SAFETY: the name is written only while the TCB is set up (before anyone else sees
        // it) and cleared when it is recycled (nobody holds a reference then).
        unsafe { (*self.name.get()).as_deref() }
    }

    pub fn name_arc(&self) -> Option<Arc<str>> {
        // SAFETY: as in `name`.
        unsafe { (*self.name.get()).clone() }
    }

    /// Where the packet lives: inline, or on the heap.
    pub fn packet_ptr(&self) -> *mut u8 {
        let heap = self.packet_heap.get();
        if heap.is_null() {
            self.packet.get() as *mut u8
        } else {
            heap
        }
    }

    /// Sets up the packet storage for `layout`; returns where to write.
    pub fn alloc_packet(&self, layout: Layout) -> *mut u8 {
        if layout.size() <= INLINE_PACKET && layout.align() <= 16 {
            self.packet.get() as *mut u8
        } else {
            // SAFETY: the layout is non-zero-sized (checked: it did not fit inline, so its size
            // is above 128 or its alignment above 16; a zero size with a big alignment is
            // rounded up to one byte).
            let layout = Layout::from_size_align(layout.size().max(1), layout.align())
                .expect("packet layout");
            // SAFETY: `layout` has a non-zero size.
            let p = unsafe { alloc::alloc::alloc(layout) };
            if p.is_null() {
                alloc::alloc::handle_alloc_error(layout);
            }
            self.packet_heap.set(p);
            self.packet_layout.set(Some(layout));
            p
        }
    }

    /// Frees a packet `alloc_packet` put on the heap (the pool, recycling the block).
    #[inline]
    pub(super) fn free_packet(&self) {
        let heap = self.packet_heap.replace(ptr::null_mut());
        if let Some(layout) = self.packet_layout.take() {
            // SAFETY: allocated by `alloc_packet` with this layout.
            unsafe { alloc::alloc::dealloc(heap, layout) };
        }
    }

    /// Before making itself findable by a waker: the next [`wait`] sleeps until [`Tcb::wake`].
    #[inline]
    pub fn prepare_wait(&self) {
        self.wake.store(WAITING, Ordering::Relaxed);
    }

    /// Whether a waker came ([`Tcb::prepare_wait`] undone).
    #[inline]
    pub fn is_woken(&self) -> bool {
        self.wake.load(Ordering::Acquire) == WOKEN
    }

    /// Marks the thread woken: true means it was parked, and the caller now owns it (runnable,
    /// in no queue) and must run or queue it (`sched::wake` queues it).
    #[inline]
    pub fn wake_owned(&self) -> bool {
        self.wake.swap(WOKEN, Ordering::AcqRel) == PARKED
    }

    pub fn flag(&self, flag: u32) -> bool {
        self.flags.load(Ordering::Relaxed) & flag != 0
    }

    pub fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::Relaxed);
    }
}
/// The TCB at `raw` (a pointer a queue or a handle kept).
///
/// # Safety
/// `raw` came from a `&Tcb` of this module (TCBs are never freed).
#[inline(always)]
pub unsafe fn from_raw(raw: *const Tcb) -> &'static Tcb {
    // SAFETY: the caller guarantees `raw` points at a leaked TCB.
    unsafe { &*raw }
}

/// "'name'" or "<unnamed #id>", for messages.
pub fn describe(t: &Tcb) -> DescribeThread<'_> {
    DescribeThread(t)
}

/// Formats a thread for messages.
#[derive(Debug)]
pub struct DescribeThread<'a>(&'a Tcb);

impl core::fmt::Display for DescribeThread<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0.name() {
            Some(name) => write!(f, "'{name}'"),
            None => write!(f, "'<unnamed #{}>'", self.0.id.get()),
        }
    }
}
