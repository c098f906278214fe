//! Socket waits (`protocol::net::NetRing`): a thread whose socket operation would block parks
//! here, not its vCPU.
//!
//! [`call`] takes a free tag, records its thread under it, marks itself waiting and makes the
//! `net` hypercall with the tag. If the VMM answers `NET_WAITING` the thread parks; the VMM's
//! net thread puts `(tag, events)` into the ring when the host socket is ready, and the
//! operation is retried. Completions are taken like block completions (`blk_async.rs`): at
//! the top of every scheduler loop and by idle vCPUs, which the VMM interrupts (only idle
//! ones). Tags bound the ring: a tag is free again only after its thread was woken.

use core::cell::UnsafeCell;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use activm_stub::hypercall;
use activm_stub::protocol::hypercall::Hypercall;
use activm_stub::protocol::net::{NetCompletion, NetRing, NET_RING_CAPACITY, NET_WAITING};
use activm_stub::protocol::shared::{SharedHeader, SHARED_FEATURE_NET_DOORBELL};
use activm_stub::sync::SpinLock;

use crate::tcb::Tcb;
use crate::{sched, tcb, timer};

struct Ring(UnsafeCell<NetRing>);

// SAFETY: `head` and `tail` are atomics; entries are read with volatile loads after an acquire
// load of `head` (the VMM wrote them before its release store of `head`).
unsafe impl Sync for Ring {}

static RING: Ring = Ring(UnsafeCell::new(NetRing::new()));

fn ring() -> &'static NetRing {
    // SAFETY: only the atomics are accessed through this reference; entries go through `entry`.
    unsafe { &*RING.0.get() }
}

fn entry(slot: usize) -> NetCompletion {
    // SAFETY: `slot < NET_RING_CAPACITY`; the VMM finished writing it before publishing the
    // head this slot is below.
    unsafe { ptr::read_volatile(ptr::addr_of!((*RING.0.get()).entries[slot])) }
}

const UNSET: u8 = 0;
const SETTING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(UNSET);

const WORDS: usize = NET_RING_CAPACITY / 64;
#[allow(clippy::declare_interior_mutable_const)]
const ALL_FREE: AtomicU64 = AtomicU64::new(u64::MAX);
static FREE_TAGS: [AtomicU64; WORDS] = [ALL_FREE; WORDS];

#[allow(clippy::declare_interior_mutable_const)]
const NO_THREAD: AtomicPtr<tcb::Tcb> = AtomicPtr::new(ptr::null_mut());
pub(crate) static WAITERS: [AtomicPtr<tcb::Tcb>; NET_RING_CAPACITY] =
    [NO_THREAD; NET_RING_CAPACITY];

static CONSUMER: SpinLock<()> = SpinLock::new(());

/// Registers the ring once; whether waits are possible.
pub(crate) fn ring_ready() -> bool {
    loop {
        match STATE.load(Ordering::Acquire) {
            READY => return true,
            FAILED => return false,
            SETTING => core::hint::spin_loop(),
            _ => {
                if STATE
                    .compare_exchange(UNSET, SETTING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // SAFETY: the ring is a static, 64-byte aligned, for the guest's lifetime.
                    let r = unsafe {
                        hypercall::raw(Hypercall::NetRingSetup as u64, RING.0.get() as u64, 0, 0, 0)
                    };
                    STATE.store(if r == 0 { READY } else { FAILED }, Ordering::Release);
                }
            }
        }
    }
}

pub(crate) fn take_tag() -> Option<u32> {
    for (w, word) in FREE_TAGS.iter().enumerate() {
        let mut free = word.load(Ordering::Relaxed);
        while free != 0 {
            let bit = free.trailing_zeros();
            match word.compare_exchange_weak(
                free,
                free & !(1 << bit),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(w as u32 * 64 + bit),
                Err(now) => free = now,
            }
        }
    }
    None
}

pub(crate) fn free_tag(tag: u32) {
    FREE_TAGS[tag as usize / 64].fetch_or(1 << (tag % 64), Ordering::Release);
}

/// Performs a socket operation: `op(tag)` makes the `net` hypercall with wait tag `tag`; while
/// it answers `NET_WAITING` the thread parks until the VMM reports the socket ready, then the
/// operation is retried. Returns the VMM's final answer (a value or `-errno`).
///
/// # Safety
/// `op` upholds the `net` call's contract (buffers live and owned until this returns).
pub unsafe fn call(mut op: impl FnMut(u64) -> u64) -> u64 {
    loop {
        if !ring_ready() {
            return op(activm_stub::protocol::net::NET_NO_WAIT);
        }
        let Some(tag) = take_tag() else {
            // Every tag in use: try without waiting, and give others a turn if it would block.
            let r = op(activm_stub::protocol::net::NET_NO_WAIT);
            if r != (-11i64) as u64 {
                return r;
            }
            sched::yield_current();
            continue;
        };
        let me = sched::current();
        WAITERS[tag as usize].store(me as *const tcb::Tcb as *mut tcb::Tcb, Ordering::Relaxed);
        me.prepare_wait();
        let r = op(u64::from(tag));
        if r == NET_WAITING {
            sched::wait(me);
            free_tag(tag);
            continue;
        }
        // Not waiting: nobody will wake this tag (the next wait prepares afresh).
        free_tag(tag);
        return r;
    }
}

/// Parks the calling thread until the VMM reports `waiter` (a stream's receive buffer,
/// `protocol::net::NetRx::waiter`), unless `ready()` holds after the tag is published. May
/// also return early (no free tag, another thread waiting on the same buffer): the caller
/// looks again and calls this again.
pub fn wait_for(waiter: &AtomicU32, ready: impl Fn() -> bool) {
    if !ring_ready() {
        sched::yield_current();
        return;
    }
    let Some(tag) = take_tag() else {
        sched::yield_current();
        return;
    };
    let me = sched::current();
    WAITERS[tag as usize].store(me as *const tcb::Tcb as *mut tcb::Tcb, Ordering::Relaxed);
    me.prepare_wait();
    if waiter
        .compare_exchange(0, tag + 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        free_tag(tag);
        sched::yield_current();
        return;
    }
    if ready()
        && waiter
            .compare_exchange(tag + 1, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        // Taken back before the VMM saw it: nobody will report this tag.
        free_tag(tag);
        return;
    }
    // The VMM reports the tag (now or after its next fill).
    sched::wait(me);
    free_tag(tag);
}

/// Whether threads wait for sockets (an idle vCPU then keeps its processor, as with block
/// requests in flight: the VMM's report interrupts a halted vCPU that holds one).
pub(crate) fn waits_armed() -> bool {
    FREE_TAGS
        .iter()
        .any(|w| w.load(Ordering::Relaxed) != u64::MAX)
}

/// Whether the VMM's sender is awake and sends queued transmit-ring bytes without a doorbell
/// (`NetRing::sender`; the caller stored its ring's `head` with sequentially consistent order
/// before this load).
pub fn sender_polling() -> bool {
    STATE.load(Ordering::Relaxed) == READY && ring().sender.load(Ordering::SeqCst) != 0
}

/// When the oldest transmit-ring bytes not yet rung for were queued (TSC; 0: none).
static DOORBELL_SINCE: AtomicU64 = AtomicU64::new(0);
/// A deferred doorbell is rung at the latest this long after the bytes were queued (at the
/// next scheduler loop), else when the vCPU runs out of threads.
const DOORBELL_DUE_NS: u64 = 20_000;

/// Bytes were queued in a transmit ring (`NetTx::head` stored, sequentially consistent): one
/// doorbell for all rings is rung when this vCPU runs out of threads or
/// [`DOORBELL_DUE_NS`] later, unless the VMM's sender is awake then. Replies of several threads
/// that a vCPU serves in a row thus share one exit.
pub fn defer_doorbell() {
    if DOORBELL_SINCE.load(Ordering::Relaxed) == 0 {
        let _ = DOORBELL_SINCE.compare_exchange(
            0,
            crate::arch::cpu::rdtsc().max(1),
            Ordering::SeqCst,
            Ordering::Relaxed,
        );
    }
}

/// Rings the deferred doorbell (`force`: now; else only if it is due).
pub(crate) fn ring_deferred_doorbell(force: bool) {
    let since = DOORBELL_SINCE.load(Ordering::Relaxed);
    if since == 0
        || (!force
            && crate::arch::cpu::rdtsc().wrapping_sub(since)
                < crate::percpu::ns_to_ticks(DOORBELL_DUE_NS))
    {
        return;
    }
    if DOORBELL_SINCE.swap(0, Ordering::SeqCst) == 0 || sender_polling() {
        return;
    }
    if doorbell_store() {
        // The VMM's net thread sends: no exit (~22 us from CPL3 here, against ~63 us for the
        // call, which also sends on this vCPU's thread).
        hypercall::net_doorbell();
        return;
    }
    // SAFETY: `tx_flush_all` takes no guest buffer.
    unsafe {
        hypercall::raw(
            Hypercall::Net as u64,
            activm_stub::protocol::net::net_arg(activm_stub::protocol::net::NET_OP_TX_FLUSH_ALL, 0),
            0,
            0,
            0,
        )
    };
}

/// Whether the VMM takes the transmit doorbell as a store (`SHARED_FEATURE_NET_DOORBELL`).
fn doorbell_store() -> bool {
    let shared = activm_stub::boot_info().shared_area;
    if shared == 0 {
        return false;
    }
    // SAFETY: the shared area's first page is its header, mapped for the guest's lifetime;
    // `features` is written once by the VMM before the guest starts.
    let features = unsafe { (*(shared as *const SharedHeader)).features };
    features & SHARED_FEATURE_NET_DOORBELL != 0
}

/// Whether readiness reports wait in the ring (looks only).
pub(crate) fn completions_ready() -> bool {
    STATE.load(Ordering::Relaxed) == READY
        && ring().head.load(Ordering::Acquire) != ring().tail.load(Ordering::Relaxed)
}

/// Takes every report in the ring and wakes its thread (scheduler loop).
pub(crate) fn poll_completions() {
    ring_deferred_doorbell(false);
    if !completions_ready() {
        return;
    }
    let Some(_consumer) = CONSUMER.try_lock() else {
        return;
    };
    let r = ring();
    let tail = r.tail.load(Ordering::Relaxed);
    let head = r.head.load(Ordering::Acquire);
    let n = head.wrapping_sub(tail) as usize;
    if n > NET_RING_CAPACITY {
        panic!(
            "activm-rt: net ring: head {head} is more than {NET_RING_CAPACITY} past tail {tail}"
        );
    }
    // Each report's claim is made under the consumer's lock, so a waiter that gives up a tag
    // whose report is on its way ([`abandon`]) knows whether the claim was made.
    let mut threads = [ptr::null::<tcb::Tcb>(); NET_RING_CAPACITY];
    let mut woken = 0;
    for i in 0..n {
        let e = entry(tail.wrapping_add(i as u32) as usize % NET_RING_CAPACITY);
        if e.tag >= NET_RING_CAPACITY as u64 {
            panic!("activm-rt: net readiness with tag {} from the VMM", e.tag);
        }
        if let Some(t) = take_report(e.tag as u32) {
            threads[woken] = t;
            woken += 1;
        }
    }
    r.tail.store(head, Ordering::Release);
    drop(_consumer);
    // While this vCPU gets through its queue sooner than a halted vCPU would wake, the woken
    // threads run here one after the other and no halted vCPU is interrupted for them: a
    // socket reader's turn is short (~1 us for a key-value request), an interrupt to a halted
    // vCPU and its halt after cost over 100 us each on this platform (`sched::wakeup`). A
    // spinning vCPU still takes a share. Behind a longer queue they are woken as usual.
    let local = sched::runs_soon_here(woken);
    for &thread in &threads[..woken] {
        // SAFETY: the thread waits for this very report (its claim was ours), so its TCB is
        // live until it is woken; nothing touches it after the wake.
        let t = unsafe { &*thread };
        if local {
            if t.wake_owned() {
                sched::make_runnable(t, false);
            }
        } else {
            sched::wake(t);
        }
    }
}

/// A waiter that gave up its tag while the report was on its way ([`abandon`]).
fn orphan() -> *mut Tcb {
    ptr::dangling_mut()
}

/// Under the consumer's lock: the report of `tag` arrived. The thread the caller must wake, if
/// any: none for a tag given up (it is free again), nor when the waiter's timer or another
/// report of the same wait claimed it first.
fn take_report(tag: u32) -> Option<*const Tcb> {
    let waiter = WAITERS[tag as usize].swap(ptr::null_mut(), Ordering::AcqRel);
    if waiter == orphan() {
        free_tag(tag);
        return None;
    }
    if waiter.is_null() {
        return None; // reported twice: nobody waits for it any more
    }
    // SAFETY: the thread waits for this report (its tag is not free), so its TCB is live.
    claim_report(unsafe { &*waiter }).then_some(waiter.cast_const())
}

/// Reports `tag` from the guest itself, as the VMM would (an `eventfd` write wakes a thread
/// that waits for it beside sockets): its waiter is woken unless it was woken already.
pub fn report_local(tag: u32) {
    if tag as usize >= NET_RING_CAPACITY {
        return;
    }
    let woken = {
        let _consumer = CONSUMER.lock();
        take_report(tag)
    };
    if let Some(t) = woken {
        // SAFETY: as in `poll_completions`: the claim was ours, so the thread waits for it.
        sched::wake(unsafe { &*t });
    }
}

/// A waiter gives up `tag`, whose report is in the ring or on its way (it could not take the
/// wait back): the report frees the tag without waking anyone, or, if it was taken already,
/// the tag is freed now.
pub(crate) fn abandon(tag: u32) {
    let _consumer = CONSUMER.lock();
    let before = WAITERS[tag as usize].swap(orphan(), Ordering::AcqRel);
    if before.is_null() {
        WAITERS[tag as usize].store(ptr::null_mut(), Ordering::Relaxed);
        free_tag(tag);
    }
}

/// The reporter of `t`'s tag (`poll_completions`): whether it must wake `t`. False when `t`'s
/// timer claimed the wake-up first (the claim is recorded: `t` sees it, see the module).
pub(crate) fn claim_report(t: &Tcb) -> bool {
    loop {
        let (from, wake) = match t.timed.load(Ordering::Acquire) {
            timer::TIMED_ARMED => (timer::TIMED_ARMED, true),
            timer::TIMED_BY_TIMER => (timer::TIMED_BY_TIMER, false),
            timer::TIMED_NONE => return true,
            // Claimed already: never twice for one wait.
            _ => return false,
        };
        if t.timed
            .compare_exchange(
                from,
                timer::TIMED_NOTIFIED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return wake;
        }
    }
}
