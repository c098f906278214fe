//! Asynchronous block requests (`protocol::blk::BlkRing`): the thread parks here, not its vCPU.
//!
//! A request takes a free tag, records its thread under the tag, marks itself waiting and calls
//! `blk_submit`. If the VMM answers `BLK_IN_FLIGHT` the thread parks; an I/O thread of the VMM
//! does the work and puts `(tag, result)` into the ring. Any vCPU's scheduler takes completions
//! at the top of its loop ([`poll_completions`]) and its idle loop watches the ring
//! ([`completions_ready`], via `dispatch::idle::work_queued`), so a busy vCPU is never interrupted for a
//! completion and an idle one halts until the VMM's interrupt (it interrupts only vCPUs whose
//! `idle_vcpus` bit is set).
//!
//! When the VMM offers a submission ring (`protocol::blk_submit`, `--rt-blk-ring=on`; off by default)
//! the request is not a hypercall: the thread writes it into its tag's slot, sets the tag's bit
//! and rings the doorbell only if the VMM's consumer thread said it sleeps (a store KVM takes
//! without an exit); the result then always comes through the completion ring.
//!
//! One consumer at a time (a try-lock: a vCPU that finds it taken just goes on; the holder
//! takes everything up to the head it reads). Tags bound what the ring holds: a tag is free
//! again only after its thread read its result, so in flight plus unconsumed never exceeds
//! [`BLK_RING_CAPACITY`].

use core::cell::UnsafeCell;
use core::ptr;
use core::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering};

use activm_stub::hypercall;
use activm_stub::protocol::blk::{
    blk_submit_arg, BlkCompletion, BlkRing, BLK_FLAG_ASYNC, BLK_INFO_FLAGS, BLK_IN_FLIGHT, BLK_OK,
    BLK_RING_CAPACITY,
};
use activm_stub::protocol::blk_submit::{
    BlkSubmission, BlkSubmitRing, BLK_CONSUMER_AWAKE, BLK_CONSUMER_SLEEPING, BLK_FLAG_SUBMIT_RING,
};
use activm_stub::sync::SpinLock;

use crate::{config, sched, tcb};

/// The ring: written by the VMM's I/O threads, hence the cell.
struct Ring(UnsafeCell<BlkRing>);

// SAFETY: `head` and `tail` are atomics; entries are read with volatile loads after an acquire
// load of `head` (the VMM wrote them before its release store of `head`).
unsafe impl Sync for Ring {}

static RING: Ring = Ring(UnsafeCell::new(BlkRing::new()));

fn ring() -> &'static BlkRing {
    // SAFETY: only the atomics are accessed through this reference; entries go through
    // `entry` (volatile reads of memory the VMM writes).
    unsafe { &*RING.0.get() }
}

fn entry(slot: usize) -> BlkCompletion {
    // SAFETY: `slot < BLK_RING_CAPACITY`; the entry is plain data the VMM finished writing
    // before it published the head this slot is below.
    unsafe { ptr::read_volatile(ptr::addr_of!((*RING.0.get()).entries[slot])) }
}

/// The submission ring: read by the VMM's consumer thread, hence the cell.
struct SubmitRing(UnsafeCell<BlkSubmitRing>);

// SAFETY: `submitted` and `consumer` are atomics; a slot is written only by the thread that
// holds its tag, before the release (SeqCst) OR that publishes it, and read only by the VMM.
unsafe impl Sync for SubmitRing {}

static SUBMIT_RING: SubmitRing = SubmitRing(UnsafeCell::new(BlkSubmitRing::new()));

/// Requests go through the submission ring (decided with `MODE`).
static SUBMIT_RING_ON: AtomicBool = AtomicBool::new(false);

fn submit_ring() -> &'static BlkSubmitRing {
    // SAFETY: only the atomics are accessed through this reference; slots go through
    // `submit_through_ring` (volatile writes by the tag's holder).
    unsafe { &*SUBMIT_RING.0.get() }
}

/// Starts a request through the submission ring (the result comes in the completion ring);
/// `false` if it took the request back for the caller to submit with `blk_submit` instead.
///
/// The handshake with the VMM's consumer (`protocol::blk_submit`): publish the tag's bit, then
/// look whether the consumer sleeps; the consumer says it sleeps, then looks at the bits. Both
/// are SeqCst store-then-load, so one of the two sees the other: no request is left unseen
/// with its consumer asleep, and an awake consumer costs no doorbell.
///
/// With the consumer asleep and the doorbell an exit (the default), the request is taken back
/// and goes by `blk_submit`'s exit, which completes a request the host answers at once (the
/// page cache) inside it: a lone 4 KiB read took 126-172 us through the ring, its result
/// handed to an I/O thread and back by interrupt, against 67 by the exit (`cargo xtask bench
/// io`, "one 4 KiB read"). Whoever clears the bit owns the request: the consumer takes bits
/// with one swap.
fn submit_through_ring(tag: u32, request: BlkSubmission) -> bool {
    // SAFETY: `tag < BLK_RING_CAPACITY` and we hold it, so no other thread writes this slot
    // and the VMM does not read it before the bit below is set.
    unsafe {
        ptr::write_volatile(
            ptr::addr_of_mut!((*SUBMIT_RING.0.get()).slots[tag as usize]),
            request,
        )
    };
    let r = submit_ring();
    r.submitted.fetch_or(1 << tag, Ordering::SeqCst);
    if r.consumer.load(Ordering::SeqCst) == BLK_CONSUMER_SLEEPING {
        if config::blk_doorbell_exit() {
            let bit = 1 << tag;
            // Ours again unless the consumer took it meanwhile (then it is awake).
            return r.submitted.fetch_and(!bit, Ordering::SeqCst) & bit == 0;
        }
        hypercall::blk_doorbell();
    }
    true
}

const UNDECIDED: u8 = 0;
const DECIDING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

/// Whether requests go through the ring (decided at the first request).
static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Free tags, one bit each.
static FREE_TAGS: AtomicU64 = AtomicU64::new(u64::MAX);

/// The thread waiting on each tag, and its result.
struct Waiter {
    thread: AtomicPtr<tcb::Tcb>,
    result: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const NO_WAITER: Waiter = Waiter {
    thread: AtomicPtr::new(ptr::null_mut()),
    result: AtomicU64::new(0),
};

static WAITERS: [Waiter; BLK_RING_CAPACITY] = [NO_WAITER; BLK_RING_CAPACITY];

/// Held while completions are taken off the ring.
static CONSUMER: SpinLock<()> = SpinLock::new(());

/// Whether the ring is in use; sets it up on the first call.
fn async_on() -> bool {
    loop {
        match MODE.load(Ordering::Acquire) {
            ON => return true,
            OFF => return false,
            // Another thread decides (two hypercalls): wait for its answer rather than take
            // the synchronous path, which blocks this vCPU in the VMM.
            DECIDING => {
                sched::yield_current();
                core::hint::spin_loop();
            }
            _ => {
                if MODE
                    .compare_exchange(UNDECIDED, DECIDING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break;
                }
            }
        }
    }
    ring()
        .nudge_us
        .store(config::blk_nudge_us(), Ordering::Relaxed);
    let flags = hypercall::blk_info(BLK_INFO_FLAGS);
    let on = config::use_blk_async()
        && flags & BLK_FLAG_ASYNC != 0
        // SAFETY: the ring is a static (in the image, 64-byte aligned) for the guest's lifetime.
        && unsafe { hypercall::blk_ring_setup(RING.0.get()) } == BLK_OK;
    let submit_ring_on = on
        && config::use_blk_ring()
        && flags & BLK_FLAG_SUBMIT_RING != 0
        // SAFETY: as above, for the submission ring.
        && unsafe { hypercall::blk_submit_ring_setup(SUBMIT_RING.0.get()) } == BLK_OK;
    SUBMIT_RING_ON.store(submit_ring_on, Ordering::Relaxed);
    MODE.store(if on { ON } else { OFF }, Ordering::Release);
    on
}

fn take_tag() -> Option<u32> {
    let mut free = FREE_TAGS.load(Ordering::Relaxed);
    while free != 0 {
        let tag = free.trailing_zeros();
        match FREE_TAGS.compare_exchange_weak(
            free,
            free & !(1 << tag),
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Some(tag),
            Err(now) => free = now,
        }
    }
    None
}

/// Performs one request (`op` a `BLK_OP_*`); through the ring if possible, else with
/// `sync_call` (the blocking hypercall). Returns `BLK_OK` or a `BLK_ERR_*` code.
///
/// # Safety
/// `buf` is live, identity-mapped guest memory at or above the image base of `count` sectors,
/// untouched by anything else until this returns (nothing for a flush).
pub(crate) unsafe fn request(
    op: u64,
    sector: u64,
    buf: u64,
    count: u64,
    sync_call: impl FnOnce() -> u64,
) -> u64 {
    if !async_on() {
        return sync_call();
    }
    let Some(tag) = take_tag() else {
        // Every tag in use: wait in the VMM like before.
        return sync_call();
    };
    let me = sched::current();
    let waiter = &WAITERS[tag as usize];
    waiter
        .thread
        .store(me as *const tcb::Tcb as *mut tcb::Tcb, Ordering::Relaxed);
    me.prepare_wait();
    let code = if SUBMIT_RING_ON.load(Ordering::Relaxed) {
        let request = BlkSubmission {
            sector,
            gpa: buf,
            op_count: blk_submit_arg(op, count),
            // The device's latency counts from here, however late the VMM looks.
            submitted_at: crate::arch::cpu::rdtsc(),
        };
        if submit_through_ring(tag, request) {
            BLK_IN_FLIGHT
        } else {
            // SAFETY: as below.
            unsafe { hypercall::blk_submit(sector, buf, op, count, u64::from(tag)) }
        }
    } else {
        // SAFETY: the caller upholds the buffer contract until we return, which is after the
        // completion; `tag` is ours (taken from the free set) and so not in flight.
        unsafe { hypercall::blk_submit(sector, buf, op, count, u64::from(tag)) }
    };
    let code = if code == BLK_IN_FLIGHT {
        sched::wait(me);
        waiter.result.load(Ordering::Acquire)
    } else {
        code
    };
    FREE_TAGS.fetch_or(1 << tag, Ordering::Release);
    code
}

/// Whether requests wait in the submission ring that no VMM consumer is awake to take: this
/// vCPU's next exit (its halt) is what takes them.
pub(crate) fn submissions_unseen() -> bool {
    SUBMIT_RING_ON.load(Ordering::Relaxed) && {
        let r = submit_ring();
        r.submitted.load(Ordering::Relaxed) != 0
            && r.consumer.load(Ordering::Relaxed) != BLK_CONSUMER_AWAKE
    }
}

/// Whether requests go through the completion ring (decided by the first request).
pub fn in_use() -> bool {
    MODE.load(Ordering::Relaxed) == ON
}

/// Whether asynchronous requests are in flight (an idle vCPU then keeps its processor: giving
/// it back would cost a new activation when the completion comes).
pub(crate) fn requests_in_flight() -> bool {
    FREE_TAGS.load(Ordering::Relaxed) != u64::MAX
}

/// Whether completions wait in the ring (looks only).
pub(crate) fn completions_ready() -> bool {
    MODE.load(Ordering::Relaxed) == ON
        && ring().head.load(Ordering::Acquire) != ring().tail.load(Ordering::Relaxed)
}

/// Takes every completion in the ring and wakes its thread (scheduler loop). A vCPU that finds
/// the ring taken leaves its completions to the holder, which looks again after it lets go: a
/// completion the VMM posted while this vCPU's thread was in an exit is taken before this vCPU
/// runs a thread, by it or by the holder (the VMM does not nudge for those).
pub(crate) fn poll_completions() {
    while completions_ready() {
        if !take_completions() {
            return;
        }
        // Let go, then look at the head again: a vCPU whose try-lock failed meanwhile saw the
        // ring held (a locked RMW), so either its completions are seen here or it took the ring.
        fence(Ordering::SeqCst);
    }
}

/// One pass of [`poll_completions`]: `false` if another vCPU holds the ring.
fn take_completions() -> bool {
    let mut done = [(0u64, 0u64); BLK_RING_CAPACITY];
    let n = {
        let Some(_consumer) = CONSUMER.try_lock() else {
            return false;
        };
        let r = ring();
        let tail = r.tail.load(Ordering::Relaxed);
        let head = r.head.load(Ordering::Acquire);
        let n = head.wrapping_sub(tail) as usize;
        if n > BLK_RING_CAPACITY {
            panic!("activm-rt: block completion ring: head {head} is more than {BLK_RING_CAPACITY} past tail {tail}");
        }
        for (i, slot) in done.iter_mut().take(n).enumerate() {
            let e = entry(tail.wrapping_add(i as u32) as usize % BLK_RING_CAPACITY);
            *slot = (e.tag, e.result);
        }
        r.tail.store(head, Ordering::Release);
        n
    };
    let mut first = true;
    for &(tag, result) in &done[..n] {
        let Some(waiter) = WAITERS.get(tag as usize) else {
            panic!("activm-rt: block completion with tag {tag} from the VMM");
        };
        let thread = waiter.thread.load(Ordering::Relaxed);
        waiter.result.store(result, Ordering::Release);
        // SAFETY: the thread waits for this very completion (its tag is not free), so its TCB
        // is live until it is woken; nothing touches it after the wake.
        let t = unsafe { &*thread };
        if first {
            // The first one runs next here (like a wake-up preemption: an I/O-bound thread
            // should not wait behind the computing ones for its short turn). With nothing else
            // queued here it is simply the next to run, and no other vCPU needs waking.
            if t.wake_owned() {
                if crate::percpu::this().is_empty() {
                    sched::make_runnable(t, false);
                } else {
                    sched::make_next(t);
                }
                first = false;
            }
        } else {
            sched::wake(t);
        }
    }
    true
}
