//! Scheduler activations: turning them on, new activations, and the upcall handler.
//!
//! **Records.** The VMM puts records in a vCPU's queue (`protocol::shared`) and raises
//! `VECTOR_UPCALL`. The handler ([`on_upcall`]) only preempts the interrupted thread (or, if it
//! may not, defers); the scheduler drains the queue at the top of its loop ([`drain`]), one
//! record at a time with a restartable sequence that copies the record and publishes the new
//! tail in one commit, in sequence order. Each kind:
//!
//! * NEWPROC: the activation running this code is new (its entry, [`__rt_activation_entry`],
//!   already took over the vCPU); counted and checked.
//! * PREEMPTED / UNBLOCKED (with a context): resumed here, see [`resume_context`].
//! * BLOCKED: the thread that ran on that activation is blocked in the VMM; it stays recorded
//!   under its activation id until its UNBLOCKED arrives.
//! * SIGNAL: the handler installed with [`set_signal_handler`] runs in a new thread (default:
//!   print and exit with 128 + signal).
//! * USER: `sa_preempt` from another vCPU: the interrupted thread was already preempted; the
//!   hook set with [`set_user_hook`] runs in the scheduler.
//!
//! **What a context is.** A record names the activation and the vCPU it ran on. That vCPU's
//! runtime words (`%gs` block: current thread, in-scheduler flag, idle flag, hold count,
//! scheduler stack) describe the context, and stay untouched while the VMM keeps the vCPU
//! parked. Whoever comes first takes them: the upcall handler processing the record (CAS of the
//! vCPU's activation word from the record's activation to 0), or the vCPU's next activation
//! (its entry swaps in its own id and files a snapshot under the old id for the record to find).
//!
//! **Critical-section recovery** (seed 000 section 6, seed 002). Before anything else a context
//! whose `rip` lies in a restartable sequence is rewound to its abort address, one inside the
//! stub trampoline before its EOI skips that EOI (it belongs to the other vCPU's APIC), and one
//! inside an activation entry is resolved by hand. Then:
//! * a thread context with preemption holds (a spinlock held) is **continued at once** on this
//!   vCPU, before anything else runs, with the hold count moved here and `PEND_CONT` set; its
//!   last release calls the safepoint, which switches it out and back to this scheduler;
//! * a thread context without holds becomes runnable on this vCPU;
//! * a scheduler context that was idling (nothing in flight) is dropped; one that was busy is
//!   **adopted**: this vCPU's scheduler gives up its own stack and continues the other one's,
//!   which only ever uses `%gs` afresh, so it simply goes on as this vCPU's scheduler.

use alloc::boxed::Box;
use core::cell::UnsafeCell;
use core::mem::{offset_of, MaybeUninit};
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

use activm_stub::arch::x86_64::percpu::{HOLD_OFFSET, PENDING_OFFSET};
use activm_stub::protocol::arch::x86_64::{
    UserContext, VECTOR_RESCHEDULE, VECTOR_TIMER, VECTOR_UPCALL,
};
use activm_stub::protocol::hypercall::{Hypercall, HC_UNSUPPORTED};
use activm_stub::protocol::shared::{
    SharedHeader, UpcallKind, UpcallRecord, VcpuArea, VcpuRunState, RECORD_HAS_CONTEXT,
    STACK_POOL_CAPACITY, UPCALL_QUEUE_CAPACITY,
};
use activm_stub::sync::SpinLock;
use activm_stub::{preempt, println, IrqFrame};

use crate::arch::context;
use crate::arch::cpu::{self, offset, Word};
use crate::arch::rseq;
use crate::sched::{self, PEND_CONT, PEND_UPCALL};
use crate::tcb::{self, Tcb};
use crate::{percpu, start};

/// The runtime's private vector for the simulated VMM ([`sim`]).
pub const VECTOR_SIM: u8 = 0x41;
/// Size of an activation (scheduler) stack from the pool.
const ACT_STACK_SIZE: usize = 64 * 1024;

/// A fixed-capacity, lock-free bag for the upcall path's bookkeeping. The path from an upcall
/// record to continuing a preempted lock holder must take no lock (the holder may hold it: seed
/// 000 section 6) and allocate nothing (it may hold the heap lock). Each slot goes FREE ->
/// WRITING -> FULL -> READING -> FREE, claimed by compare-and-swap; a slot also carries a key
/// (an activation id, or 0) so takers can look for an item without claiming others.
struct Bag<T, const N: usize> {
    state: [AtomicU8; N],
    key: [AtomicU64; N],
    items: [UnsafeCell<MaybeUninit<T>>; N],
    len: AtomicU32,
}

// SAFETY: a slot's item is written only by the CPU that moved it FREE -> WRITING and read only
// by the one that moved it FULL -> READING; the state's release/acquire orders the accesses.
unsafe impl<T: Send, const N: usize> Sync for Bag<T, N> {}

const SLOT_FREE: u8 = 0;
const SLOT_WRITING: u8 = 1;
const SLOT_FULL: u8 = 2;
const SLOT_READING: u8 = 3;

impl<T: Copy, const N: usize> Bag<T, N> {
    const fn new() -> Self {
        Bag {
            state: [const { AtomicU8::new(SLOT_FREE) }; N],
            key: [const { AtomicU64::new(0) }; N],
            items: [const { UnsafeCell::new(MaybeUninit::uninit()) }; N],
            len: AtomicU32::new(0),
        }
    }

    fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    fn push(&self, key: u64, item: T) {
        preempt::hold();
        for i in 0..N {
            if self.state[i]
                .compare_exchange(
                    SLOT_FREE,
                    SLOT_WRITING,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                // SAFETY: the slot is ours (WRITING) until we publish it.
                unsafe { (*self.items[i].get()).write(item) };
                self.key[i].store(key, Ordering::Relaxed);
                self.len.fetch_add(1, Ordering::AcqRel);
                self.state[i].store(SLOT_FULL, Ordering::Release);
                preempt::release();
                return;
            }
        }
        panic!("activm-rt: upcall bookkeeping full ({N} entries)");
    }

    fn take_at(&self, i: usize) -> Option<T> {
        if self.state[i]
            .compare_exchange(
                SLOT_FULL,
                SLOT_READING,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return None;
        }
        // SAFETY: FULL means written and published; the slot is ours (READING).
        let item = unsafe { (*self.items[i].get()).assume_init_read() };
        self.len.fetch_sub(1, Ordering::AcqRel);
        self.state[i].store(SLOT_FREE, Ordering::Release);
        Some(item)
    }

    /// Takes an item filed under `key`.
    fn take_key(&self, key: u64) -> Option<T> {
        preempt::hold();
        let mut found = None;
        for i in 0..N {
            if self.state[i].load(Ordering::Acquire) == SLOT_FULL
                && self.key[i].load(Ordering::Relaxed) == key
            {
                // The slot may have been refilled since: the key is checked again once ours.
                if let Some(item) = self.take_if_key(i, key) {
                    found = Some(item);
                    break;
                }
            }
        }
        preempt::release();
        found
    }

    fn take_if_key(&self, i: usize, key: u64) -> Option<T> {
        if self.state[i]
            .compare_exchange(
                SLOT_FULL,
                SLOT_READING,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return None;
        }
        if self.key[i].load(Ordering::Relaxed) != key {
            self.state[i].store(SLOT_FULL, Ordering::Release);
            return None;
        }
        // SAFETY: FULL means written and published; the slot is ours (READING).
        let item = unsafe { (*self.items[i].get()).assume_init_read() };
        self.len.fetch_sub(1, Ordering::AcqRel);
        self.state[i].store(SLOT_FREE, Ordering::Release);
        Some(item)
    }

    /// Takes any item.
    fn pop(&self) -> Option<T> {
        if self.len() == 0 {
            return None;
        }
        preempt::hold();
        let mut found = None;
        for i in 0..N {
            if self.state[i].load(Ordering::Relaxed) == SLOT_FULL {
                if let Some(item) = self.take_at(i) {
                    found = Some(item);
                    break;
                }
            }
        }
        preempt::release();
        found
    }

    /// Calls `f` on every item (diagnostics, once things are quiet).
    fn for_each_item(&self, mut f: impl FnMut(&T)) {
        for i in 0..N {
            if self.state[i].load(Ordering::Acquire) == SLOT_FULL {
                // SAFETY: a FULL slot holds an initialized item; diagnostics only, read when
                // nobody takes items (a racing take would make this a stale copy, never UB for
                // the plain-integer records it is used on).
                f(unsafe { (*self.items[i].get()).assume_init_ref() });
            }
        }
    }

    /// Calls `f` on a copy of every item (diagnostics: racy, items may change meanwhile).
    fn for_each_key(&self, mut f: impl FnMut(u64)) {
        for i in 0..N {
            if self.state[i].load(Ordering::Acquire) == SLOT_FULL {
                f(self.key[i].load(Ordering::Relaxed));
            }
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static SHARED: AtomicU64 = AtomicU64::new(0);
/// Largest sequence number processed so far, and how many records.
static MAX_SEQ: AtomicU64 = AtomicU64::new(0);
pub static RECORDS: AtomicU64 = AtomicU64::new(0);
/// Records by kind (index = kind).
pub static BY_KIND: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
/// Records whose sequence number was not above the previous one of the same queue.
pub static SEQ_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Signals received (last number).
pub static LAST_SIGNAL: AtomicU64 = AtomicU64::new(0);

/// Whether the VMM delivers upcalls to this guest.
pub fn activations_enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

fn header() -> &'static SharedHeader {
    // SAFETY: the shared area's first page is the header, mapped for the guest's lifetime.
    unsafe { &*(SHARED.load(Ordering::Relaxed) as *const SharedHeader) }
}

fn area(vcpu: u32) -> &'static VcpuArea {
    let at = SHARED.load(Ordering::Relaxed)
        + activm_stub::protocol::shared::vcpu_area_offset(vcpu as usize) as u64;
    // SAFETY: vCPU `vcpu`'s area of the shared area (checked against nr_vcpus by callers).
    unsafe { &*(at as *const VcpuArea) }
}

/// Marks vCPU `vcpu` idle (or not) in the shared header, for the VMM.
pub fn set_idle(vcpu: u32, idle: bool) {
    if SHARED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let bit = 1u64 << vcpu;
    if idle {
        header().idle_vcpus.fetch_or(bit, Ordering::AcqRel);
    } else {
        header().idle_vcpus.fetch_and(!bit, Ordering::AcqRel);
    }
}

/// vCPU 0, at boot: where the shared area is.
pub fn init() {
    SHARED.store(activm_stub::boot_info().shared_area, Ordering::Release);
}

/// Every vCPU, at boot: its words for the upcall queue and its boot activation.
pub fn init_vcpu(vcpu: u32) {
    let a = area(vcpu);
    cpu::set(Word::Area, a as *const VcpuArea as u64);
    let activation = match a.activation.load(Ordering::Acquire) {
        0 => vcpu + 1,
        id => id,
    };
    cpu::set(Word::Activation, u64::from(activation));
}

/// Whether this vCPU's upcall queue holds records.
#[inline]
pub fn queue_nonempty() -> bool {
    let at = cpu::get(Word::Area);
    if at == 0 {
        return false;
    }
    // SAFETY: `Word::Area` points at this vCPU's area.
    let a = unsafe { &*(at as *const VcpuArea) };
    a.queue_head.load(Ordering::Acquire) != a.queue_tail.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Activation stacks (the seed's sa_stacks pool).

/// Activation stacks not in the shared pool (tops; 0: empty slot). Lock-free: stacks are given
/// back and taken on upcall paths, which must not wait for a lock a preempted context may hold.
static SPARES: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];
static NR_SPARE: AtomicU32 = AtomicU32::new(0);
/// Serialises producing into the shared pool (only `refill_pool`, after records are handled).
static PRODUCE: SpinLock<()> = SpinLock::new(());

fn put_spare(top: u64) {
    for s in &SPARES {
        if s.compare_exchange(0, top, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            NR_SPARE.fetch_add(1, Ordering::AcqRel);
            return;
        }
    }
    // Otherwise the stack is leaked (64 KiB); 256 spares is plenty.
}

fn take_spare() -> Option<u64> {
    if NR_SPARE.load(Ordering::Acquire) == 0 {
        return None;
    }
    for s in &SPARES {
        let top = s.load(Ordering::Relaxed);
        if top != 0
            && s.compare_exchange(top, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            NR_SPARE.fetch_sub(1, Ordering::AcqRel);
            return Some(top);
        }
    }
    None
}

fn new_act_stack() -> u64 {
    let stack = alloc::vec![0u8; ACT_STACK_SIZE].leak();
    let top = (stack.as_ptr() as u64 + stack.len() as u64) & !15;
    let i = NR_ACT_STACKS.fetch_add(1, Ordering::AcqRel);
    if let Some(slot) = ACT_STACKS.get(i) {
        slot.store(top, Ordering::Release);
    }
    top
}

/// The tops of every activation stack made (they are recycled, never freed), so a context's
/// stack pointer can be told to lie on one ([`act_stack_top_of`]).
static ACT_STACKS: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];
static NR_ACT_STACKS: AtomicUsize = AtomicUsize::new(0);

/// The top of the activation stack `sp` lies on, if it lies on one.
fn act_stack_top_of(sp: u64) -> Option<u64> {
    let n = NR_ACT_STACKS.load(Ordering::Acquire).min(ACT_STACKS.len());
    ACT_STACKS[..n]
        .iter()
        .map(|slot| slot.load(Ordering::Acquire))
        .find(|&top| top != 0 && sp < top && sp >= top - ACT_STACK_SIZE as u64 + 16)
}

/// Where an interrupt taken at a new activation's first instruction leaves that instruction's
/// address: the stub pushes `[vector, error code, rflags, rip]` under the entry's stack pointer,
/// `top - 8`. The entry's own first stores overwrite it (with `top`), and a stack is cleared
/// there when given back, so this word names the entry only while such an interrupt's handler
/// (or one nested in it) runs before the entry did anything.
const ENTRY_MARK_OFFSET: u64 = 16;

/// Scheduler context, at a fresh entry (so not on a retired stack): gives back the stack this
/// vCPU's scheduler left when it adopted another one.
pub fn release_retired_stack() {
    let p = percpu::this();
    if p.retired_stack.load(Ordering::Relaxed) != 0 {
        release_act_stack(p.retired_stack.swap(0, Ordering::AcqRel));
    }
}

/// Gives back an activation stack nobody runs on any more (lock-free; the shared pool is
/// refilled after the records are handled).
pub fn release_act_stack(top: u64) {
    if top != 0 {
        // SAFETY: a stack nobody runs on (its owner is handing it back); `top` is a 16-byte
        // aligned activation stack top, so the word under it is inside the stack.
        unsafe { ((top - ENTRY_MARK_OFFSET) as *mut u64).write_volatile(0) };
        // SAFETY: as above; the word where an interrupt in the entry's window leaves its `rip`
        // (see `resolve_entry_interrupt_context`).
        unsafe { ((top - ENTRY_SP_OFFSET - 8) as *mut u64).write_volatile(0) };
        put_spare(top);
    }
}

/// Keeps the shared stack pool full (the VMM takes one per new activation). New stacks are
/// allocated with no lock held. Not on the path that continues lock holders (it may wait for
/// the pool lock and the heap lock).
fn refill_pool() {
    if !activations_enabled() {
        return;
    }
    let h = header();
    loop {
        let need_new = {
            let _produce = PRODUCE.lock();
            let prod = h.stack_prod.load(Ordering::Relaxed);
            let cons = h.stack_cons.load(Ordering::Acquire);
            let queued = prod.wrapping_sub(cons);
            if queued as usize >= STACK_POOL_CAPACITY {
                return;
            }
            let top = if NR_SPARE.load(Ordering::Acquire) as usize > SPARE_RESERVE {
                take_spare().unwrap_or(0)
            } else {
                0
            };
            if top == 0 && queued >= pool_target() {
                return;
            }
            if top != 0 {
                let slot = prod as usize % STACK_POOL_CAPACITY;
                let stacks = core::ptr::addr_of!(h.stacks) as *mut u64;
                // SAFETY: the guest produces the pool: slot `prod % CAP` is free (prod - cons <
                // CAP), and only this code (under the lock) writes it.
                unsafe { stacks.add(slot).write_volatile(top) };
                h.stack_prod.store(prod.wrapping_add(1), Ordering::Release);
            }
            top == 0
        };
        if need_new {
            put_spare(new_act_stack());
        }
    }
}

/// How many stacks the shared pool keeps ready, allocating new ones if needed. Every new
/// activation takes one, and the pool is refilled only by a scheduler that drains its queue: if
/// a burst of grants and revocations (allocation chaos on a loaded host) empties it while no
/// activation of the guest runs, the VMM has no stack to start one on, and nothing can refill
/// it (seen in the soak under a loaded test suite: the guest stalled for a second and was
/// stopped). So the pool is kept deep: eight stacks per vCPU and sixteen more, at most its
/// capacity (64 KiB each; they are recycled, never freed).
fn pool_target() -> u32 {
    (8 * start::nr_vcpus() + 16).min(STACK_POOL_CAPACITY as u32)
}

/// Whether the shared stack pool holds less than half of [`pool_target`] (cheap: two loads).
fn pool_low() -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    let h = header();
    let queued = h
        .stack_prod
        .load(Ordering::Relaxed)
        .wrapping_sub(h.stack_cons.load(Ordering::Relaxed));
    queued < pool_target() / 2
}

fn hypercall(nr: Hypercall, a0: u64) -> u64 {
    // SAFETY: the sa_* calls take numbers or the address of a function of this image.
    unsafe { activm_stub::hypercall::raw(nr as u64, a0, 0, 0, 0) }
}

/// vCPU 0, once every vCPU runs its scheduler: registers the activation entry, fills the stack
/// pool and enables upcalls, unless the VMM does not offer them (`--no-activations`) or the
/// guest said `--rt-sa=off`. Returns whether they are on.
pub fn enable() -> bool {
    if !crate::config::use_sa() {
        return false;
    }
    let entry = __rt_activation_entry as *const () as u64;
    if hypercall(Hypercall::SaRegister, entry) == HC_UNSUPPORTED {
        return false;
    }
    ENABLED.store(true, Ordering::Release);
    refill_pool();
    hypercall(Hypercall::SaSetConcurrency, u64::from(start::nr_vcpus()));
    header()
        .requested_concurrency
        .store(start::nr_vcpus(), Ordering::Release);
    if hypercall(Hypercall::SaEnable, 0) == HC_UNSUPPORTED {
        ENABLED.store(false, Ordering::Release);
        return false;
    }
    true
}

/// Asks the VMM to give this guest `n` processors (`sa_setconcurrency`); returns the previous
/// value, or `None` without activations.
pub fn set_concurrency(n: u32) -> Option<u32> {
    if !activations_enabled() {
        return None;
    }
    header().requested_concurrency.store(n, Ordering::Release);
    Some(hypercall(Hypercall::SaSetConcurrency, u64::from(n)) as u32)
}

/// vCPUs that gave their processor back idle and have not started a new activation since.
static YIELDED: AtomicU64 = AtomicU64::new(0);
/// TSC of the last time this guest asked for its processors back.
static LAST_ASK: AtomicU64 = AtomicU64::new(0);
/// At most one ask per this many ns: an ask may come to nothing (its new activation canceled
/// under a revoke, or a yield that lost to a preemption), so asking again must stay possible.
const ASK_INTERVAL_NS: u64 = 1_000_000;

/// Scheduler of an idle vCPU: gives its processor back to the VMM (`sa_yield`) unless it is
/// the only vCPU running or records wait in its queue. The activation ends there; the next
/// NEWPROC on this vCPU names it and its stack is recycled then (see `handle`). Returns if it
/// did not yield.
pub fn yield_idle_vcpu(me: u32) {
    if !activations_enabled() || granted_vcpus() < 2 || queue_nonempty() {
        return;
    }
    let bit = 1u64 << me;
    YIELDED.fetch_or(bit, Ordering::SeqCst);
    // A waker that published work before seeing this bit found no idle vCPU and did not ask
    // for processors (`want_processors`): look once more now that the bit is visible (both
    // sides store, then load, with a full barrier between).
    if sched::work_queued() {
        YIELDED.fetch_and(!bit, Ordering::AcqRel);
        return;
    }
    percpu::bump(&percpu::this().counters.idle_yields);
    hypercall(Hypercall::SaYield, 0);
    // Still here: upcalls are off after all.
    YIELDED.fetch_and(!bit, Ordering::AcqRel);
}

/// Work is waiting and no vCPU idles here to take it: if some gave their processors back,
/// ask the VMM for them again (`sa_setconcurrency`), at most once a millisecond.
pub fn want_processors() {
    if YIELDED.load(Ordering::SeqCst) == 0 {
        return;
    }
    let now = cpu::rdtsc();
    let last = LAST_ASK.load(Ordering::Relaxed);
    if now.saturating_sub(last) < crate::timer::ns_to_ticks(ASK_INTERVAL_NS)
        || LAST_ASK
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let n = header().requested_concurrency.load(Ordering::Acquire);
    let n = if n == 0 { start::nr_vcpus() } else { n };
    hypercall(Hypercall::SaSetConcurrency, u64::from(n));
}

/// How many processors the VMM's allocator grants this guest now (0 without activations).
/// `SharedHeader::granted_vcpus` is only written at boot by the VMM of this writing, so this
/// counts the vCPUs whose state the VMM says is running.
pub fn granted_vcpus() -> u32 {
    if !activations_enabled() {
        return 0;
    }
    (0..start::nr_vcpus())
        .filter(|&v| area(v).state.load(Ordering::Acquire) == VcpuRunState::Running as u32)
        .count() as u32
}

/// Delivers a USER upcall to vCPU `vcpu` (`sa_preempt`); false without activations.
pub fn preempt_vcpu(vcpu: u32) -> bool {
    activations_enabled() && hypercall(Hypercall::SaPreempt, u64::from(vcpu)) == 0
}

// ---------------------------------------------------------------------------------------------
// Activation state: who ran on a preempted (or blocked) activation.

/// What a vCPU's words said when its activation ended.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
struct ActState {
    activation: u32,
    vcpu: u32,
    current: u64,
    hold: u64,
    in_sched: bool,
    sched_idle: bool,
    /// The activation's scheduler stack, still owned by this state (0: already given back).
    sched_top: u64,
}

/// States filed by new activations (and BLOCKED records), keyed by activation id.
static TABLE: Bag<ActState, 256> = Bag::new();

/// The words `__rt_activation_entry` saves before it claims the vCPU (layout used by the
/// assembly and by `resolve_entry_context`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct OldWords {
    current: u64,
    in_sched: u64,
    sched_idle: u64,
    sched_top: u64,
    hold: u64,
    activation: u64,
    new_top: u64,
}

/// Tag on a vCPU's activation word while an activation entry resets the words it claimed.
/// An activation taken away inside that window did nothing: its record's handler files the
/// state before it (from the entry's stack) and the next activation, finding the tag, files
/// nothing (the words are half reset: filing them would give stacks away twice).
const CLAIMING: u64 = 1 << 63;

/// Files the state of the activation a vCPU had before (its new activation took the vCPU).
fn file_old_state(vcpu: u32, old: &OldWords) {
    if old.activation == 0 || old.activation & CLAIMING != 0 {
        return;
    }
    let st = own_stack(ActState {
        activation: old.activation as u32,
        vcpu,
        current: old.current,
        hold: old.hold,
        in_sched: old.in_sched != 0,
        sched_idle: old.sched_idle != 0,
        sched_top: old.sched_top,
    });
    TABLE.push(u64::from(st.activation), st);
}

/// Decides who keeps a taken state's scheduler stack: a scheduler context, or nobody (a thread
/// ran there: the stack is free and goes back to the pool).
fn own_stack(st: ActState) -> ActState {
    if st.in_sched {
        st
    } else {
        release_act_stack(st.sched_top);
        ActState { sched_top: 0, ..st }
    }
}

/// Takes the state of `activation` (on `vcpu`): from the table, or straight from the vCPU's
/// words if its next activation has not started. `None`: not available yet.
fn take_state(activation: u32, vcpu: u32) -> Option<ActState> {
    if let Some(st) = TABLE.take_key(u64::from(activation)) {
        return Some(st);
    }
    if vcpu >= start::nr_vcpus() {
        return None;
    }
    let read = |w: Word| cpu::get_of(vcpu, w);
    let st = ActState {
        activation,
        vcpu,
        current: read(Word::Current),
        hold: cpu::hold_of(vcpu),
        in_sched: read(Word::InSched) != 0,
        sched_idle: read(Word::SchedIdle) != 0,
        sched_top: read(Word::SchedTop),
    };
    let word = activm_stub::arch::x86_64::percpu::cpu_local(vcpu as usize)
        .rt_word(Word::Activation as usize);
    if word
        .compare_exchange(
            u64::from(activation),
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Its next activation claimed the words first; its snapshot will be in the table.
        return None;
    }
    // The words are ours: the vCPU's next activation finds nothing to file. It resets them
    // itself; writing them here would race with it (that activation may already be running,
    // holding a spinlock or draining, by the time this line would run).
    Some(own_stack(st))
}

// ---------------------------------------------------------------------------------------------
// New activations.

core::arch::global_asm!(
    ".pushsection .text.activm_rt.entry, \"ax\"",
    // A new activation (NEWPROC): rdi = vCPU, rsi = activation id, rsp = stack top - 8 (a
    // zero return address there), interrupts on. Until the words are reset an interrupt must
    // not trust them: [__rt_act_window_start, __rt_act_window_end) is an unsafe window.
    ".globl __rt_activation_entry",
    "__rt_activation_entry:",
    "__rt_act_window_start:",
    "    sub $56, %rsp",
    "    mov %gs:{current}, %rax",
    "    mov %rax, 0(%rsp)",
    "    mov %gs:{in_sched}, %rax",
    "    mov %rax, 8(%rsp)",
    "    mov %gs:{sched_idle}, %rax",
    "    mov %rax, 16(%rsp)",
    "    mov %gs:{sched_top}, %rax",
    "    mov %rax, 24(%rsp)",
    "    mov %gs:{hold}, %rax",
    "    mov %rax, 32(%rsp)",
    "    lea 64(%rsp), %rax",
    "    mov %rax, 48(%rsp)",
    "    mov %rsi, %rax",
    "    bts ${claiming_bit}, %rax",
    // The claim: this vCPU's words are now this activation's, still being reset (tagged
    // CLAIMING); rax = the previous activation.
    "    xchg %rax, %gs:{activation}",
    ".globl __rt_act_claimed",
    "__rt_act_claimed:",
    "    mov %rax, 40(%rsp)",
    "    movq $1, %gs:{in_sched}",
    "    movq $0, %gs:{current}",
    "    movq $0, %gs:{hold}",
    "    movq $0, %gs:{pending}",
    "    movq $0, %gs:{sched_idle}",
    "    movq $0, %gs:{armed}",
    "    lea 64(%rsp), %rax",
    "    mov %rax, %gs:{sched_top}",
    // The words are whole: drop the tag (the window's last instruction).
    "    mov %rsi, %gs:{activation}",
    ".globl __rt_act_window_end",
    "__rt_act_window_end:",
    "    mov %rsp, %rcx",
    "    lea 64(%rsp), %rdx",
    "    xor %ebp, %ebp",
    "    call {start}",
    "    ud2",
    ".popsection",
    current = const offset(Word::Current),
    in_sched = const offset(Word::InSched),
    sched_idle = const offset(Word::SchedIdle),
    sched_top = const offset(Word::SchedTop),
    activation = const offset(Word::Activation),
    armed = const offset(Word::Armed),
    hold = const HOLD_OFFSET,
    pending = const PENDING_OFFSET,
    claiming_bit = const CLAIMING.trailing_zeros(),
    start = sym activation_start,
    options(att_syntax),
);

const _: () = {
    assert!(offset_of!(OldWords, current) == 0);
    assert!(offset_of!(OldWords, in_sched) == 8);
    assert!(offset_of!(OldWords, sched_idle) == 16);
    assert!(offset_of!(OldWords, sched_top) == 24);
    assert!(offset_of!(OldWords, hold) == 32);
    assert!(offset_of!(OldWords, activation) == 40);
    assert!(offset_of!(OldWords, new_top) == 48);
};

extern "C" {
    fn __rt_activation_entry();
    static __rt_act_window_start: u8;
    static __rt_act_claimed: u8;
    static __rt_act_window_end: u8;
}

fn entry_window() -> (u64, u64, u64) {
    (
        core::ptr::addr_of!(__rt_act_window_start) as u64,
        core::ptr::addr_of!(__rt_act_claimed) as u64,
        core::ptr::addr_of!(__rt_act_window_end) as u64,
    )
}

/// Whether code at `rip` must not be switched away: the trampoline before its EOI, or an
/// activation entry before it reset the words.
pub fn in_unsafe_window(rip: u64) -> bool {
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    let (entry_start, _, entry_end) = entry_window();
    (trap_start..trap_end).contains(&rip) || (entry_start..entry_end).contains(&rip)
}

/// The vectors whose EOI a previous activation may have left owed on this vCPU.
const OUR_VECTORS: [u8; 4] = [VECTOR_TIMER, VECTOR_RESCHEDULE, VECTOR_UPCALL, VECTOR_SIM];

/// Rust side of a new activation, on its pool stack, with the vCPU's words already reset.
extern "C" fn activation_start(_vcpu: u64, _activation: u64, _top: u64, old: *const OldWords) -> ! {
    context::reset_fp_control();
    let me = activm_stub::vcpu_id();
    // SAFETY: the entry saved the previous words at `old`, on this stack.
    let old = unsafe { *old };
    activm_stub::lapic::clear_in_service(&OUR_VECTORS);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    file_old_state(me, &old);
    sched::clear_idle_bits(me);
    percpu::trace(percpu::T_ACTIVATION, _activation);
    percpu::bump(&percpu::this().counters.activations);
    sched::sched_loop()
}

// ---------------------------------------------------------------------------------------------
// The upcall interrupt and the queue.

/// `VECTOR_UPCALL`: the scheduler drains the queue; preempt the thread to get there.
pub fn on_upcall(frame: &mut IrqFrame) {
    percpu::bump(&percpu::this().counters.upcalls);
    if sched::irq_prologue(frame) {
        sched::preempt_current();
        return;
    }
    let p = percpu::this();
    // Not on top of an idle scheduler (`SchedIdle`): a context the VMM takes there is dropped
    // as having nothing in flight, and the records this drain had taken would go with it (a
    // lock holder's continuation lost: rt-demo hung beside an I/O-heavy neighbour, which takes
    // its idle vCPUs away often). The idle loop sees the deferred work and drains at its top.
    if cpu::get(Word::InSched) != 0
        && cpu::get(Word::SchedIdle) == 0
        && preempt::held() == 0
        && p.in_drain.load(Ordering::Relaxed) == 0
        && !in_unsafe_window(frame.rip)
    {
        // The scheduler, holding nothing, maybe waiting for a lock whose holder's context is
        // in this very queue: handle the records now (seed 000 section 6: continue preempted
        // holders before anything else).
        percpu::trace(percpu::T_NESTED, frame.rip);
        drain_nested();
        return;
    }
    preempt::defer(PEND_UPCALL);
}

/// Records that could not be handled yet (their activation's state was not filed yet).
static LATER: Bag<UpcallRecord, 64> = Bag::new();

/// Records waiting in the retry list (diagnostics and tests: zero once things settle).
pub fn records_waiting() -> u32 {
    LATER.len()
}

/// Prints the records in the retry list (diagnostics, once things are quiet).
#[doc(hidden)]
pub fn print_waiting_records() {
    LATER.for_each_item(|r| {
        println!(
            "waiting: kind {} act {} vcpu {} seq {} rip {:#x} rsp {:#x}",
            r.kind, r.activation, r.vcpu, r.seq, r.context.rip, r.context.gprs.rsp
        )
    });
}

/// Scheduler context: handles every record of this vCPU's queue (and any left for later). May
/// not return (a continued lock holder, an adopted scheduler context).
pub fn drain() {
    if CONTINUE.len() != 0 {
        if let Some((t, hold)) = CONTINUE.pop() {
            // SAFETY: a saved lock holder queued by `resume_context_in`; ours now.
            continue_holder(unsafe { tcb::from_raw(t as *const Tcb) }, hold);
        }
    }
    if ADOPT.len() != 0 {
        adopt_pending();
    }
    if LATER.len() != 0 {
        retry_later();
    }
    if !queue_nonempty() {
        // A drain that ended in a lock holder's continuation or an adoption never got to its
        // refill below; the scheduler that starts afresh afterwards refills here.
        if pool_low() {
            refill_pool();
        }
        return;
    }
    let p = percpu::this();
    p.in_drain.store(1, Ordering::Relaxed);
    drain_records(false);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    // Re-arm the time-slice timer at the next switch-in: on our hosts a vCPU's armed one-shot
    // timer was seen never to fire after an upcall interrupt reached it under heavy host load
    // (docs/runtime.md); one APIC write per upcall is cheap insurance.
    cpu::set(Word::Armed, 0);
    refill_pool();
}

/// Whether [`drain`] has anything to do (the scheduler's direct hand-offs skip the loop only
/// when it has not).
#[inline]
pub fn loop_work() -> bool {
    CONTINUE.len() != 0 || ADOPT.len() != 0 || LATER.len() != 0 || queue_nonempty()
}

/// Drains the queue from the upcall interrupt, on top of a scheduler holding nothing: resumes
/// contexts and continues lock holders (coming back here), leaves the rest to the loop top.
fn drain_nested() {
    let p = percpu::this();
    p.in_drain.store(1, Ordering::Relaxed);
    drain_records(true);
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    // As in `drain`: re-arm the slice timer at the next switch-in.
    cpu::set(Word::Armed, 0);
    preempt::defer(PEND_UPCALL);
}

fn drain_records(nested: bool) {
    let mut rec = MaybeUninit::<UpcallRecord>::uninit();
    let mut last_seq = 0u64;
    // SAFETY: `take_record` writes a whole record before returning true.
    while rseq::take_record(unsafe { &mut *rec.as_mut_ptr() }) {
        // SAFETY: as above.
        let r = unsafe { rec.assume_init_ref() };
        if r.seq <= last_seq {
            SEQ_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        last_seq = r.seq;
        MAX_SEQ.fetch_max(r.seq, Ordering::AcqRel);
        RECORDS.fetch_add(1, Ordering::Relaxed);
        percpu::bump(&percpu::this().counters.records);
        if let Some(slot) = BY_KIND.get(r.kind as usize) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
        if nested {
            handle_nested(r);
        } else {
            handle(r);
        }
    }
}

fn handle_nested(r: &UpcallRecord) {
    percpu::trace(
        percpu::T_RECORD,
        (1 << 52) | (u64::from(r.kind) << 48) | r.seq,
    );
    match UpcallKind::from_raw(r.kind) {
        Some(UpcallKind::Preempted | UpcallKind::Unblocked)
            if r.flags & RECORD_HAS_CONTEXT != 0 =>
        {
            resume_context_in(r, true)
        }
        Some(UpcallKind::Blocked) => blocked(r),
        Some(UpcallKind::NewProc) => new_proc(r),
        _ => later(r),
    }
}

fn retry_later() {
    // Handle what was left for later (one pass: records left again wait for the next one).
    for _ in 0..64 {
        match LATER.pop() {
            Some(r) => handle(&r),
            None => return,
        }
    }
}

/// NEWPROC: if `arg` names the activation this vCPU had before and it ended by `sa_yield` (no
/// other record will name it), its idle scheduler's state is dropped and its stack recycled.
fn new_proc(r: &UpcallRecord) {
    YIELDED.fetch_and(!(1u64 << r.vcpu.min(63)), Ordering::AcqRel);
    if r.arg == 0 {
        return;
    }
    if let Some(st) = take_state(r.arg as u32, r.vcpu) {
        if st.in_sched {
            sched::clear_idle_bits(st.vcpu);
            release_act_stack(st.sched_top);
        }
    }
}

fn handle(r: &UpcallRecord) {
    percpu::trace(percpu::T_RECORD, (u64::from(r.kind) << 48) | r.seq);
    match UpcallKind::from_raw(r.kind) {
        Some(UpcallKind::NewProc) => new_proc(r),
        Some(UpcallKind::Preempted | UpcallKind::Unblocked) => {
            if r.flags & RECORD_HAS_CONTEXT != 0 {
                resume_context(r);
            }
        }
        Some(UpcallKind::Blocked) => blocked(r),
        Some(UpcallKind::Signal) => signal(r.arg),
        Some(UpcallKind::User) => {
            let hook = USER_HOOK.load(Ordering::Acquire);
            if !hook.is_null() {
                // SAFETY: only `set_user_hook` stores non-null values, all `fn(u32)`.
                let hook = unsafe { core::mem::transmute::<*mut (), fn(u32)>(hook) };
                hook(r.arg as u32);
            }
        }
        None => println!(
            "activm-rt: ignoring an upcall record of unknown kind {}",
            r.kind
        ),
    }
}

fn later(r: &UpcallRecord) {
    LATER.push(0, *r);
}

/// Activations whose UNBLOCKED was handled before their BLOCKED (the VMM keeps both in one
/// queue while it can, but a BLOCKED copied out by a scheduler that was then preempted is
/// handled wherever that scheduler is adopted): their BLOCKED is dropped when it comes.
static UNBLOCKED_EARLY: Bag<(), 64> = Bag::new();

fn blocked(r: &UpcallRecord) {
    sched::rescue_ring_of(r.vcpu);
    let Some(st) = take_state(r.activation, r.vcpu) else {
        if UNBLOCKED_EARLY.take_key(u64::from(r.activation)).is_none() {
            later(r);
        }
        return;
    };
    if st.current != 0 && !st.in_sched {
        // SAFETY: the thread that ran on that activation; it stays blocked (no one else has it).
        let t = unsafe { tcb::from_raw(st.current as *const Tcb) };
        t.flags
            .fetch_or(tcb::FLAG_BLOCKED_IN_VMM, Ordering::Relaxed);
        t.blocked_activation.store(r.activation, Ordering::Relaxed);
    }
    // Keep the state for the UNBLOCKED record.
    TABLE.push(u64::from(st.activation), st);
}

/// Fixes a handed-over context's instruction pointer; false if the context is a new
/// activation that had not done anything yet (it is then dropped, with its stack).
fn fix_rip(ctx: &mut UserContext) -> bool {
    if let Some(abort) = rseq::fixup(ctx.rip) {
        ctx.rip = abort;
        percpu::bump(&percpu::this().counters.rseq_rewinds);
    }
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    if (trap_start..trap_end).contains(&ctx.rip) {
        // That EOI was owed to the other vCPU's APIC; its next activation clears it.
        ctx.rip = trap_end;
    }
    true
}

/// A context taken inside `__rt_activation_entry` (before its words were reset): file what
/// the entry had saved, drop the new activation's context and give back its stack.
fn resolve_entry_context(r: &UpcallRecord) -> bool {
    let ctx = &r.context;
    let (start, _, end) = entry_window();
    // An interrupt pending when the activation started is delivered before (or between) its
    // first instructions; taken in the stub's trampoline before that saved anything, the
    // context is the trampoline's, and the entry's own rip and rsp are in the 4-word frame the
    // CPL0 stub pushed at rsp: vector, error code, rflags, rip (then the interrupted rsp).
    // A second interrupt can arrive at the trampoline's first instruction: follow the frames.
    let (trap_start, trap_end) = activm_stub::trap_eoi_window();
    let (mut rip, mut rsp) = (ctx.rip, ctx.gprs.rsp);
    for _ in 0..8 {
        if !(trap_start..=trap_end).contains(&rip) {
            break;
        }
        // SAFETY: the trampoline pushes nothing before `trap_end`, so the stub's frame is at
        // rsp, in this guest's memory (the interrupted stack).
        let frame = unsafe { *(rsp as *const [u64; 4]) };
        (rip, rsp) = (frame[3], rsp + 32);
    }
    if !(start..end).contains(&rip) {
        return false;
    }
    resolve_entry_at(r, rip, rsp, ctx.gprs.rax)
}

/// The entry of the activation of record `r` was stopped at `rip` (inside its window) with
/// stack pointer `rsp` and `rax`: file what it saved if it claimed the vCPU, drop it and give
/// back its stack.
fn resolve_entry_at(r: &UpcallRecord, rip: u64, rsp: u64, rax: u64) -> bool {
    let (start, claimed, _) = entry_window();
    let top = if rip == start { rsp + 8 } else { rsp + 64 };
    percpu::trace(percpu::T_ENTRY_CTX, rip);
    if rip >= claimed {
        // SAFETY: the entry saved the words at rsp (its `sub $56` ran before the claim).
        let mut old = unsafe { *(rsp as *const OldWords) };
        if rip == claimed {
            old.activation = rax;
        }
        file_old_state(r.vcpu, &old);
        // Unless the vCPU's next activation claimed it already (it then files nothing).
        let word = activm_stub::arch::x86_64::percpu::cpu_local(r.vcpu as usize)
            .rt_word(Word::Activation as usize);
        let _ = word.compare_exchange(
            u64::from(r.activation) | CLAIMING,
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    sched::clear_idle_bits(r.vcpu);
    release_act_stack(top);
    percpu::bump(&percpu::this().counters.dropped_idle_contexts);
    true
}

/// A context taken in an interrupt handler (or the trampoline around it) that runs on top of a
/// new activation's first instruction: that activation did nothing (its handlers only defer,
/// and the entry drops what they deferred), so the context is dropped and its stack given
/// back. Its state can never be taken: the activation never claimed the vCPU's words.
fn drop_entry_interrupt_context(r: &UpcallRecord) -> bool {
    let Some(top) = act_stack_top_of(r.context.gprs.rsp) else {
        return false;
    };
    // SAFETY: `top` is an activation stack's top (registered when made), so the word under it
    // is guest memory inside that stack; the stack's activation no longer runs.
    let mark = unsafe { ((top - ENTRY_MARK_OFFSET) as *const u64).read_volatile() };
    if mark != entry_window().0 {
        return false;
    }
    percpu::trace(percpu::T_ENTRY_CTX, r.context.rip);
    sched::clear_idle_bits(r.vcpu);
    release_act_stack(top);
    percpu::bump(&percpu::this().counters.dropped_idle_contexts);
    true
}

/// The entry's stack pointer after its first instruction (`sub $56`): `top - 64`.
const ENTRY_SP_OFFSET: u64 = 64;

/// A context taken in an interrupt handler that runs on top of a new activation's entry after
/// its first instruction and before the end of its window (the handler only deferred): the
/// stub's frame is then right under the entry's stack pointer, `top - 64`, with the entry's
/// `rip` at `top - 72` and its `rax` (saved by the trampoline) at `top - 104`. Resolved as a
/// context stopped at that entry instruction would be. (Found by six soaks at once: such a
/// PREEMPTED record was never handled, its activation's stack leaked, and when the entry had
/// already claimed the vCPU the state it saved was never filed either.)
fn resolve_entry_interrupt_context(r: &UpcallRecord) -> bool {
    let Some(top) = act_stack_top_of(r.context.gprs.rsp) else {
        return false;
    };
    let entry_rsp = top - ENTRY_SP_OFFSET;
    // Below the stub's frame and the registers the trampoline pushed: inside the handler.
    if r.context.gprs.rsp >= entry_rsp - 40 {
        return false;
    }
    // SAFETY: `entry_rsp - 40 .. entry_rsp` lies inside that activation stack (registered when
    // made), guest memory; the stack's activation no longer runs.
    let (rip, rax) = unsafe {
        (
            ((entry_rsp - 8) as *const u64).read_volatile(),
            ((entry_rsp - 40) as *const u64).read_volatile(),
        )
    };
    let (start, _, end) = entry_window();
    if !(start < rip && rip < end) {
        return false;
    }
    resolve_entry_at(r, rip, entry_rsp, rax)
}

/// Resumes the context of a PREEMPTED or UNBLOCKED record on this vCPU.
fn resume_context(r: &UpcallRecord) {
    resume_context_in(r, false)
}

/// `nested`: on top of an interrupted scheduler, which must get control back: lock holders are
/// continued with `cont_swap`, and scheduler contexts wait for the loop top to be adopted.
fn resume_context_in(r: &UpcallRecord, nested: bool) {
    if r.kind == UpcallKind::Preempted as u32 {
        sched::rescue_ring_of(r.vcpu);
    }
    if resolve_entry_context(r) {
        return;
    }
    percpu::trace(
        percpu::T_RECINFO,
        (u64::from(r.activation) << 32) | (u64::from(r.vcpu) << 24) | (r.seq & 0xff_ffff),
    );
    let Some(st) = take_state(r.activation, r.vcpu) else {
        if drop_entry_interrupt_context(r) || resolve_entry_interrupt_context(r) {
            return;
        }
        percpu::trace(percpu::T_LATER, r.seq);
        later(r);
        return;
    };
    percpu::trace(
        percpu::T_TAKE,
        (u64::from(st.in_sched) << 52)
            | (u64::from(st.sched_idle) << 51)
            | (st.hold.min(7) << 48)
            | (st.current & 0xffff_ffff),
    );
    percpu::trace(percpu::T_TAKE, r.context.gprs.rsp);
    let mut ctx = r.context;
    fix_rip(&mut ctx);
    if st.in_sched && nested && !st.sched_idle {
        ADOPT.push(0, Adopt::Context(st, ctx));
        return;
    }
    if st.in_sched {
        if st.sched_idle {
            // An idle scheduler: nothing in flight.
            percpu::trace(percpu::T_DROP_IDLE, ctx.rip);
            sched::clear_idle_bits(st.vcpu);
            release_act_stack(st.sched_top);
            percpu::bump(&percpu::this().counters.dropped_idle_contexts);
            return;
        }
        adopt(&ctx, st);
    }
    if st.current == 0 {
        println!(
            "activm-rt: dropping a context of activation {} with no thread",
            r.activation
        );
        return;
    }
    // SAFETY: the thread that ran on that activation; nobody else resumes it (its state was
    // taken exactly once).
    let t = unsafe { tcb::from_raw(st.current as *const Tcb) };
    let was_blocked = t
        .flags
        .fetch_and(!tcb::FLAG_BLOCKED_IN_VMM, Ordering::Relaxed)
        & tcb::FLAG_BLOCKED_IN_VMM
        != 0;
    if r.kind == UpcallKind::Unblocked as u32 && !was_blocked {
        UNBLOCKED_EARLY.push(u64::from(r.activation), ());
    }
    // SAFETY: the context is this guest's, taken at CPL3 on the thread's own stack; below its
    // rsp is free (the thread is not running).
    let sp = unsafe { context::build_resume_frame(&ctx) };
    // SAFETY: the thread does not run; its saved stack pointer is ours to set.
    unsafe { *t.sp.get() = sp };
    percpu::trace(percpu::T_BUILD, t as *const Tcb as u64);
    percpu::trace(percpu::T_BUILD, sp as u64);
    percpu::bump(&percpu::this().counters.resumed_contexts);
    tcb::event(t, tcb::EV_RESUMED);
    percpu::trace(percpu::T_RESUME, ctx.rip);
    if st.hold > 0 {
        tcb::event(t, tcb::EV_CONTINUED);
        if !nested {
            continue_holder(t, st.hold);
        }
        // On top of an interrupted scheduler (which may be spinning for this very holder's
        // lock): queue the continuation, which every scheduler loop serves first, and get the
        // interrupted scheduler out of the way; a scheduler adopts it back afterwards.
        CONTINUE.push(0, (t as *const Tcb as u64, st.hold));
        suspend_this_scheduler();
        return;
    }
    if r.kind == UpcallKind::Unblocked as u32 {
        // Its I/O just completed: it runs next here, ahead of threads that have been computing
        // (the thread the upcall interrupted goes back to the queue), as a Unix scheduler
        // favours a process woken from I/O.
        sched::make_next(t);
    } else {
        sched::make_runnable(t, false);
    }
}

/// Lock holders to continue before anything else: `(TCB, hold count)`.
static CONTINUE: Bag<(u64, u64), 64> = Bag::new();

/// Scheduler context at its loop top: runs the lock holder `t` (its resume frame built) now,
/// with its holds moved here, until its last release (seed 000, section 6); the safepoint then
/// switches it out (`PEND_CONT`) and this vCPU's scheduler starts afresh.
fn continue_holder(t: &Tcb, hold: u64) -> ! {
    // Leaving the scheduler (and whatever drain called this) for good.
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    percpu::trace(percpu::T_CONTINUE, t as *const Tcb as u64);
    percpu::bump(&percpu::this().counters.continuations);
    cpu::set_hold(hold);
    preempt::defer(PEND_CONT);
    sched::run_now(t, false, sched::FROM_CONTINUED)
}

/// From the upcall handler on top of a scheduler: leaves that scheduler suspended (adopted back
/// by a scheduler loop later) and runs a fresh one on a spare activation stack. Without a
/// spare stack the interrupted scheduler just goes on (the continuation waits for a loop top).
fn suspend_this_scheduler() {
    let Some(top) = take_spare_stack() else {
        return;
    };
    percpu::trace(percpu::T_SUSPEND, top);
    // SAFETY: scheduler context (InSched = 1); `top` is a free activation stack.
    unsafe { context::suspend_scheduler(top, suspended) };
    // Adopted back: this drain goes on, as the scheduler of whatever vCPU runs it now.
}

/// The fresh scheduler after `suspend_this_scheduler`, on the spare stack.
extern "C" fn suspended(sp: u64, sched_top: u64) -> ! {
    ADOPT.push(0, Adopt::Suspended { sp, sched_top });
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    sched::sched_loop()
}

/// A free activation stack from the spares (never allocates nor locks: upcall paths).
fn take_spare_stack() -> Option<u64> {
    take_spare()
}

/// Makes sure a few spare activation stacks exist (boot; `suspend_this_scheduler` uses them).
pub fn reserve_spare_stacks() {
    for _ in 0..SPARE_RESERVE {
        put_spare(new_act_stack());
    }
}

/// Spare activation stacks kept for suspensions (not handed to the VMM's pool).
const SPARE_RESERVE: usize = 4;

/// A scheduler context to adopt at the loop top.
// Stored inline in a fixed array on purpose: boxing the context would allocate on the upcall path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
enum Adopt {
    /// Taken by the VMM with this state.
    Context(ActState, UserContext),
    /// A scheduler that suspended itself for a lock holder's continuation.
    Suspended { sp: u64, sched_top: u64 },
}

/// Sized for bursts: every entry is a scheduler context on its own activation stack.
static ADOPT: Bag<Adopt, 64> = Bag::new();

/// Loop top: adopts a pending scheduler context, if any (does not return then).
fn adopt_pending() {
    match ADOPT.pop() {
        Some(Adopt::Context(st, ctx)) => adopt(&ctx, st),
        Some(Adopt::Suspended { sp, sched_top }) => {
            percpu::trace(percpu::T_ADOPT_SUSPENDED, sp);
            percpu::bump(&percpu::this().counters.adoptions);
            let own = cpu::get(Word::SchedTop);
            let old = percpu::this().retired_stack.swap(own, Ordering::AcqRel);
            release_act_stack(old);
            cpu::set(Word::SchedTop, sched_top);
            cpu::set(Word::Current, 0);
            cpu::set_hold(0);
            // It was suspended inside a drain (from the upcall handler).
            percpu::this().in_drain.store(1, Ordering::Relaxed);
            // SAFETY: scheduler context; the frame was saved by `cont_swap` on a stack nobody
            // else uses (its vCPU was taken away).
            unsafe { context::resume_switch_frame(sp as usize) }
        }
        None => {}
    }
}

/// Continues another activation's scheduler context as this vCPU's scheduler.
fn adopt(ctx: &UserContext, st: ActState) -> ! {
    // This scheduler (and its drain) is abandoned; the adopted one was not draining.
    percpu::this().in_drain.store(0, Ordering::Relaxed);
    percpu::trace(percpu::T_ADOPT_CTX, ctx.rip);
    percpu::bump(&percpu::this().counters.adoptions);
    sched::clear_idle_bits(st.vcpu);
    // This scheduler's own stack is given up; the adopted one's becomes this vCPU's. The own
    // one is still in use until the jump: it is retired, and given back by the next fresh
    // scheduler entry on this vCPU (`release_retired_stack`).
    let own = cpu::get(Word::SchedTop);
    // SAFETY: the context is a scheduler context of this guest taken at CPL3 on its own
    // activation stack, which nobody else uses now.
    let sp = unsafe { context::build_resume_frame(ctx) };
    let old = percpu::this().retired_stack.swap(own, Ordering::AcqRel);
    release_act_stack(old);
    cpu::set(Word::SchedTop, st.sched_top);
    cpu::set(Word::Current, st.current);
    cpu::set_hold(st.hold);
    // SAFETY: scheduler context (InSched = 1); the frame was built above.
    unsafe { context::jump_to_frame(sp) }
}

// ---------------------------------------------------------------------------------------------
// SIGNAL and USER.

static SIGNAL_HANDLER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
static USER_HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Installs the handler for host signals (SIGNAL upcalls): it runs in a new thread named
/// "signal". Without one the guest prints the signal and exits with 128 + its number.
pub fn set_signal_handler(handler: fn(u32)) {
    SIGNAL_HANDLER.store(handler as *mut (), Ordering::Release);
}

/// Installs a hook the scheduler calls (with the requesting vCPU) for USER upcalls.
pub fn set_user_hook(hook: fn(u32)) {
    USER_HOOK.store(hook as *mut (), Ordering::Release);
}

fn signal(signo: u64) {
    LAST_SIGNAL.store(signo, Ordering::Release);
    let handler = SIGNAL_HANDLER.load(Ordering::Acquire);
    if handler.is_null() {
        println!("activm-rt: signal {signo}, exiting");
        crate::stats::dump();
        activm_stub::exit(128 + signo as i32);
    }
    // SAFETY: only `set_signal_handler` stores non-null values, all `fn(u32)`.
    let handler = unsafe { core::mem::transmute::<*mut (), fn(u32)>(handler) };
    let _ = crate::thread::Builder::new()
        .name("signal".into())
        .spawn(move || handler(signo as u32));
}

// ---------------------------------------------------------------------------------------------
// The simulated VMM.

/// A simulated VMM for self-tests without the VMM's activations (`--no-activations` or
/// `--rt-sa=off`): it writes records into the guest's own queues exactly as the VMM would
/// (whole record, then the head with release, then the upcall interrupt), and takes a thread
/// away from a vCPU the way the VMM does (its full context, the vCPU continuing with a new
/// activation).
pub mod sim {
    use super::*;

    static LOCK: SpinLock<()> = SpinLock::new(());
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static NEXT_ACTIVATION: AtomicU32 = AtomicU32::new(1000);

    /// What to do with the captured thread.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Capture {
        /// Hand it over to `deliver_to` in a PREEMPTED record.
        Preempt { deliver_to: u32 },
        /// Keep it "blocked in the VMM": a BLOCKED record goes to the vCPU itself; call
        /// [`Request::unblock`] later.
        Block,
    }

    /// A capture request for one vCPU ([`request`]).
    #[derive(Debug)]
    pub struct Request {
        capture: Capture,
        /// Only this thread (TCB address), or any thread if 0.
        victim: u64,
        /// Only while the victim holds a preemption hold (true), only while it holds none
        /// (false), or either.
        held: Option<bool>,
        done: AtomicBool,
        activation: AtomicU32,
        vcpu: AtomicU32,
        /// Whether the captured `rip` was inside a restartable sequence.
        in_rseq: AtomicBool,
        /// The captured context (stored inline: the capture runs in interrupt context, where
        /// the interrupted thread may hold the heap lock).
        context: SpinLock<Option<UserContext>>,
    }

    impl Request {
        pub fn is_done(&self) -> bool {
            self.done.load(Ordering::Acquire)
        }

        pub fn captured_in_rseq(&self) -> bool {
            self.in_rseq.load(Ordering::Acquire)
        }

        /// The activation the captured thread ran on.
        pub fn activation(&self) -> u32 {
            self.activation.load(Ordering::Acquire)
        }

        /// For a `Block` capture: the "I/O" completes; an UNBLOCKED record with the thread's
        /// context goes to `deliver_to`.
        pub fn unblock(&self, deliver_to: u32) {
            let ctx = self.context.lock().take().expect("nothing blocked");
            post(
                deliver_to,
                UpcallKind::Unblocked,
                self.activation(),
                self.vcpu.load(Ordering::Acquire),
                0,
                Some(&ctx),
            );
        }
    }

    static REQUESTS: [AtomicPtr<Request>; 64] =
        [const { AtomicPtr::new(core::ptr::null_mut()) }; 64];
    /// What the interrupted vCPU posts once it left the captured thread's stack.
    static OUTBOX: [AtomicPtr<Request>; 64] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 64];

    fn check() {
        assert!(
            !activations_enabled(),
            "the simulated VMM needs the VMM's activations off (activm run --no-activations, or --rt-sa=off)"
        );
    }

    /// Writes one record into `target`'s queue as the VMM would, then raises the upcall
    /// interrupt there. Returns its sequence number.
    pub fn post(
        target: u32,
        kind: UpcallKind,
        activation: u32,
        vcpu: u32,
        arg: u64,
        context: Option<&UserContext>,
    ) -> u64 {
        check();
        let a = area(target);
        let seq;
        loop {
            let _g = LOCK.lock();
            let head = a.queue_head.load(Ordering::Relaxed);
            let tail = a.queue_tail.load(Ordering::Acquire);
            if head.wrapping_sub(tail) as usize >= UPCALL_QUEUE_CAPACITY {
                drop(_g);
                core::hint::spin_loop();
                continue;
            }
            seq = SEQ.fetch_add(1, Ordering::Relaxed) + 1;
            let slot = head as usize % UPCALL_QUEUE_CAPACITY;
            let at = core::ptr::addr_of!(a.records[slot]) as *mut UpcallRecord;
            let mut rec = UpcallRecord {
                seq,
                kind: kind as u32,
                flags: 0,
                activation,
                vcpu,
                delivered_to: cpu::get_of(target, Word::Activation) as u32,
                _pad: 0,
                arg,
                tsc: cpu::rdtsc(),
                _reserved: [0; 2],
                context: UserContext::default(),
            };
            if let Some(ctx) = context {
                rec.flags |= RECORD_HAS_CONTEXT;
                rec.context = *ctx;
            }
            // SAFETY: slot `head % CAP` is free (head - tail < CAP); the consumer reads it only
            // after the release store of the head below; producers are serialised by LOCK.
            unsafe { at.write_volatile(rec) };
            a.queue_head.store(head.wrapping_add(1), Ordering::Release);
            break;
        }
        preempt::hold();
        if target == activm_stub::vcpu_id() {
            cpu::send_self_ipi(VECTOR_UPCALL);
        } else {
            cpu::send_ipi(percpu::of(target).apic_id, VECTOR_UPCALL);
        }
        preempt::release();
        seq
    }

    /// The activation now running on vCPU `vcpu`.
    pub fn activation_of(vcpu: u32) -> u32 {
        cpu::get_of(vcpu, Word::Activation) as u32
    }

    /// Asks the simulated VMM to take a thread away at the next suitable interrupt on any
    /// vCPU (its timer, or the interrupt [`kick_all`] sends): the running thread (or only
    /// `victim`), while it holds a preemption hold or not (`held`; `None`: either). Poll
    /// [`Request::is_done`].
    pub fn request(
        capture: Capture,
        victim: Option<&crate::thread::Thread>,
        held: Option<bool>,
    ) -> &'static Request {
        check();
        let req = Box::leak(Box::new(Request {
            capture,
            victim: victim.map_or(0, |t| t.tcb_addr()),
            held,
            done: AtomicBool::new(false),
            activation: AtomicU32::new(0),
            vcpu: AtomicU32::new(0),
            in_rseq: AtomicBool::new(false),
            context: SpinLock::new(None),
        }));
        for slot in REQUESTS.iter().take(start::nr_vcpus() as usize) {
            assert!(
                slot.compare_exchange(
                    core::ptr::null_mut(),
                    req,
                    Ordering::AcqRel,
                    Ordering::Acquire
                )
                .is_ok(),
                "a capture request is pending"
            );
        }
        req
    }

    impl Request {
        /// Withdraws the request where it has not been acted on.
        pub fn cancel(&'static self) {
            withdraw(self);
        }
    }

    fn withdraw(req: &Request) {
        let p = req as *const Request as *mut Request;
        for slot in REQUESTS.iter() {
            let _ = slot.compare_exchange(
                p,
                core::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Sends the simulated VMM's interrupt to every vCPU (to act on a request now).
    pub fn kick_all() {
        let me = activm_stub::vcpu_id();
        preempt::hold();
        for v in 0..start::nr_vcpus() {
            if v == me {
                cpu::send_self_ipi(VECTOR_SIM);
            } else {
                cpu::send_ipi(percpu::of(v).apic_id, VECTOR_SIM);
            }
        }
        preempt::release();
    }

    /// The simulated VMM's interrupt.
    pub fn on_sim(frame: &mut IrqFrame) {
        super::sim_on_interrupt(frame);
        if sched::irq_prologue(frame) {
            sched::safepoint();
        }
    }

    /// Interrupt context on vCPU `me`, before the handler's own work: captures the interrupted
    /// thread if a request asks for it. Does not return if it does.
    pub(super) fn on_interrupt(frame: &IrqFrame) {
        let me = activm_stub::vcpu_id();
        let slot = &REQUESTS[me as usize];
        let req = slot.load(Ordering::Acquire);
        if req.is_null() {
            return;
        }
        // SAFETY: requests are leaked; this one is pending for this vCPU.
        let r = unsafe { &*req };
        percpu::trace(percpu::T_SIM_SAW, frame.rip);
        let current = sched::current_raw() as u64;
        let hold = preempt::held();
        let suitable = cpu::get(Word::InSched) == 0
            && current != 0
            && (r.victim == 0 || r.victim == current)
            && r.held.is_none_or(|h| h == (hold > 0))
            && !in_unsafe_window(frame.rip);
        if !suitable
            || slot
                .compare_exchange(
                    req,
                    core::ptr::null_mut(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            return;
        }
        withdraw(r);
        r.vcpu.store(me, Ordering::Release);
        // From here on this vCPU behaves as if the VMM took the thread away and started a new
        // activation: no interrupt may treat the thread as running here any more.
        cpu::set(Word::InSched, 1);
        cpu::set_hold(0);
        let _ = cpu::take_pending();
        let ctx = context::capture(frame);
        r.in_rseq
            .store(rseq::fixup(ctx.rip).is_some(), Ordering::Release);
        let new_act = NEXT_ACTIVATION.fetch_add(1, Ordering::Relaxed);
        let old_act = cpu::get(Word::Activation);
        cpu::set(Word::Activation, u64::from(new_act));
        cpu::set(Word::Current, 0);
        cpu::set(Word::SchedIdle, 0);
        r.activation.store(old_act as u32, Ordering::Release);
        *r.context.lock() = Some(ctx);
        // The thread's state, as the new activation's entry would file it (it keeps this
        // vCPU's scheduler stack, which was free: a thread ran).
        TABLE.push(
            old_act,
            ActState {
                activation: old_act as u32,
                vcpu: me,
                current,
                hold,
                in_sched: false,
                sched_idle: false,
                sched_top: 0,
            },
        );
        OUTBOX[me as usize].store(req, Ordering::Release);
        // SAFETY: the thread's stack now belongs to its context; this vCPU is in the scheduler.
        unsafe { context::abandon_to_scheduler(after_capture) }
    }

    /// On the scheduler stack of the vCPU that captured a thread: post the record(s).
    extern "C" fn after_capture() -> ! {
        let me = activm_stub::vcpu_id();
        let req = OUTBOX[me as usize].swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: set just before the jump here; requests are leaked.
        let r = unsafe { &*req };
        activm_stub::lapic::clear_in_service(&OUR_VECTORS);
        let activation = r.activation();
        match r.capture {
            Capture::Preempt { deliver_to } => {
                let ctx = r.context.lock().take().expect("captured context");
                post(
                    deliver_to,
                    UpcallKind::Preempted,
                    activation,
                    me,
                    0,
                    Some(&ctx),
                );
            }
            Capture::Block => {
                post(me, UpcallKind::Blocked, activation, me, 0, None);
            }
        }
        r.done.store(true, Ordering::Release);
        sched::sched_loop()
    }
}

/// Called first by the runtime's timer and simulated-VMM handlers.
pub fn sim_on_interrupt(frame: &IrqFrame) {
    sim::on_interrupt(frame);
}

/// Statistics of the upcall path: (records, max sequence number, out-of-order records).
pub fn record_stats() -> (u64, u64, u64) {
    (
        RECORDS.load(Ordering::Relaxed),
        MAX_SEQ.load(Ordering::Relaxed),
        SEQ_ERRORS.load(Ordering::Relaxed),
    )
}

/// Prints the shared area's view of every vCPU (diagnostics).
pub fn dump() {
    if SHARED.load(Ordering::Relaxed) == 0 {
        return;
    }
    for v in 0..start::nr_vcpus() {
        let a = area(v);
        println!(
            "activm-rt: vCPU {v} shared area: state {} activation {} queue {}..{}",
            a.state.load(Ordering::Relaxed),
            a.activation.load(Ordering::Relaxed),
            a.queue_tail.load(Ordering::Relaxed),
            a.queue_head.load(Ordering::Relaxed),
        );
    }
    TABLE.for_each_key(|a| println!("activm-rt: filed state of activation {a}"));
    println!(
        "activm-rt: continue {} later {} adopt {} enabled {}",
        CONTINUE.len(),
        LATER.len(),
        ADOPT.len(),
        activations_enabled()
    );
    for v in 0..start::nr_vcpus() {
        let p = percpu::of(v);
        println!(
            "activm-rt: vCPU {v}: in_drain {} sched_top {:#x}",
            p.in_drain.load(Ordering::Relaxed),
            cpu::get_of(v, Word::SchedTop)
        );
    }
}
