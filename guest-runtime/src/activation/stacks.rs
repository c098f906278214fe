//! Activation stacks (NetBSD's `sa_stacks` pool): the shared pool the VMM takes a stack from
//! for every new activation, the spares kept out of it, and the record of every stack made.

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use activm_stub::protocol::shared::STACK_POOL_CAPACITY;
use activm_stub::sync::SpinLock;

use super::{poison, sa};
use crate::arch::entry::{ENTRY_MARK_OFFSET, ENTRY_RIP_OFFSET};
use crate::percpu;

/// Size of an activation (scheduler) stack from the pool.
pub(crate) const ACT_STACK_SIZE: usize = 64 * 1024;

/// Activation stacks not in the shared pool (tops; 0: empty slot). Lock-free: stacks are given
/// back and taken on upcall paths, which must not wait for a lock a preempted context may hold.
static SPARES: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];
static NR_SPARE: AtomicU32 = AtomicU32::new(0);
/// Serialises producing into the shared pool (`refill_pool`, `produce_spares`); nobody waits
/// for it.
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
            if poison::on() {
                poison::check_free(top, "taken from the spares");
            }
            return Some(top);
        }
    }
    None
}

fn new_act_stack() -> u64 {
    let stack = alloc::vec![0u8; ACT_STACK_SIZE].leak();
    let top = (stack.as_ptr() as u64 + stack.len() as u64) & !15;
    register_act_stack(top);
    if poison::on() {
        // Free from the start, like a stack given back.
        poison::given_back(top);
    }
    top
}

fn register_act_stack(top: u64) {
    let i = NR_ACT_STACKS.fetch_add(1, Ordering::AcqRel);
    if let Some(slot) = ACT_STACKS.get(i) {
        slot.store(top, Ordering::Release);
    }
}

/// A vCPU's boot stack, its first scheduler stack: it is recycled like every activation stack
/// once that scheduler is done with it, so later activations may start on it, and a context
/// taken in such an activation's entry must be told to lie on an activation stack (else its
/// record waited forever: the never-handled PREEMPTED records whose stack pointer was on a
/// boot stack). Boot stacks are larger than [`ACT_STACK_SIZE`]; their top part counts.
pub fn register_boot_stack(top: u64) {
    register_act_stack(top);
}

/// The tops of every activation stack made (they are recycled, never freed), so a context's
/// stack pointer can be told to lie on one ([`act_stack_top_of`]).
static ACT_STACKS: [AtomicU64; MAX_ACT_STACKS] = [const { AtomicU64::new(0) }; MAX_ACT_STACKS];
/// How many activation stacks are recorded (more still work, unrecorded).
pub(crate) const MAX_ACT_STACKS: usize = 1024;
static NR_ACT_STACKS: AtomicUsize = AtomicUsize::new(0);

/// Whether `at` lies on the activation stack whose top is `top` (a boot stack's top part counts).
pub(crate) fn on_act_stack(top: u64, at: u64) -> bool {
    top != 0 && at < top && at >= top.saturating_sub(ACT_STACK_SIZE as u64)
}

/// The top of the activation stack `sp` lies on, if it lies on one.
pub(crate) fn act_stack_top_of(sp: u64) -> Option<u64> {
    let n = NR_ACT_STACKS.load(Ordering::Acquire).min(ACT_STACKS.len());
    ACT_STACKS[..n]
        .iter()
        .map(|slot| slot.load(Ordering::Acquire))
        .find(|&top| top != 0 && sp < top && sp >= top - ACT_STACK_SIZE as u64 + 16)
}

/// The index of the activation stack whose top is `top` in the record (`--rt-poison-stacks`).
pub(crate) fn index_of(top: u64) -> Option<usize> {
    let n = NR_ACT_STACKS.load(Ordering::Acquire).min(ACT_STACKS.len());
    ACT_STACKS[..n]
        .iter()
        .position(|slot| slot.load(Ordering::Acquire) == top)
}

/// Whether the record holds [`MAX_ACT_STACKS`] stacks (more are not recorded).
pub(crate) fn record_full() -> bool {
    NR_ACT_STACKS.load(Ordering::Acquire) >= MAX_ACT_STACKS
}

/// The words [`release_act_stack`] clears under `top` (the entry's marks).
pub(crate) fn cleared_words(top: u64) -> [u64; 2] {
    [top - ENTRY_MARK_OFFSET, top - ENTRY_RIP_OFFSET]
}

/// Gives back the stack a scheduler left for the one it adopted, called by the switch itself
/// once it runs on the adopted stack (`context::jump_to_frame`, `resume_switch_frame`): by the
/// same context, so never while anything still runs on it. (Given back later by this vCPU's
/// next switch into its scheduler, as it was, the stack of a scheduler the VMM took between
/// leaving it and the switch went back to the pool while its context, still on it, waited to be
/// adopted: resumed on a stack another activation then used, it popped garbage.)
#[unsafe(no_mangle)]
extern "C" fn __rt_release_left_stack(top: u64) {
    release_act_stack(top);
}

/// Gives back an activation stack nobody runs on any more (lock-free; the shared pool is
/// refilled after the records are handled).
pub fn release_act_stack(top: u64) {
    if top != 0 {
        if poison::on() {
            poison::given_back(top);
        }
        // SAFETY: a stack nobody runs on (its owner is handing it back); `top` is a 16-byte
        // aligned activation stack top, so the words under it are inside the stack.
        unsafe { ((top - ENTRY_MARK_OFFSET) as *mut u64).write_volatile(0) };
        // SAFETY: as above; where an interrupt in the entry's window leaves the entry's saved pc.
        unsafe { ((top - ENTRY_RIP_OFFSET) as *mut u64).write_volatile(0) };
        put_spare(top);
    }
}

/// Keeps the shared stack pool full (the VMM takes one per new activation). New stacks are
/// allocated with no lock held. Not on the path that continues lock holders (it may wait for
/// the heap lock).
///
/// Never waits for the produce lock: whoever holds it is producing already, and may be a
/// scheduler context the VMM took, queued for adoption behind this very scheduler. A scheduler
/// spinning for that lock never reached the loop top that adopts the holder (the six-guest soak's
/// run 147: 40 s in this function, the holder tenth in the adoption bag).
pub(crate) fn refill_pool() {
    if !sa::activations_enabled() {
        return;
    }
    let h = sa::header();
    loop {
        let need_new = {
            let Some(_produce) = PRODUCE.try_lock() else {
                return;
            };
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

/// Test hook: refills the pool while this context holds the produce lock, as a producer the VMM
/// took would; returns at once if `refill_pool` does not wait for the lock.
pub fn refill_pool_beside_a_producer() {
    let _produce = PRODUCE.lock();
    refill_pool();
}

/// Puts the spare stacks beyond the reserve into the shared pool, now, if nobody else produces
/// (never waits, never allocates: safe at a new activation's start and in a nested drain). A
/// stack given back goes to the spares; only a producer moves it to the pool, and a refill runs
/// only at the end of a drain. Under a storm of blocking requests and revocations, activations
/// ended (blocked, preempted) before their drain's end one after another, the spares filled up
/// while the pool ran dry, and once every vCPU was blocked or waiting for a stack nobody was
/// left to produce: the VMM stopped the guest after a second.
pub(crate) fn produce_spares() {
    if !sa::activations_enabled() {
        return;
    }
    let Some(_produce) = PRODUCE.try_lock() else {
        return;
    };
    let h = sa::header();
    while NR_SPARE.load(Ordering::Acquire) as usize > SPARE_RESERVE {
        let prod = h.stack_prod.load(Ordering::Relaxed);
        let cons = h.stack_cons.load(Ordering::Acquire);
        if prod.wrapping_sub(cons) as usize >= STACK_POOL_CAPACITY {
            return;
        }
        let Some(top) = take_spare() else {
            return;
        };
        let slot = prod as usize % STACK_POOL_CAPACITY;
        let stacks = core::ptr::addr_of!(h.stacks) as *mut u64;
        // SAFETY: as in `refill_pool`: slot `prod % CAP` is free (prod - cons < CAP), and only
        // the holder of the produce lock writes it.
        unsafe { stacks.add(slot).write_volatile(top) };
        h.stack_prod.store(prod.wrapping_add(1), Ordering::Release);
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
    (8 * percpu::nr_vcpus() + 16).min(STACK_POOL_CAPACITY as u32)
}

/// Whether the shared stack pool holds less than half of [`pool_target`] (cheap: two loads).
pub(crate) fn pool_low() -> bool {
    if !sa::activations_enabled() {
        return false;
    }
    let h = sa::header();
    let queued = h
        .stack_prod
        .load(Ordering::Relaxed)
        .wrapping_sub(h.stack_cons.load(Ordering::Relaxed));
    queued < pool_target() / 2
}

/// A free activation stack from the spares (never allocates nor locks: upcall paths).
pub(crate) fn take_spare_stack() -> Option<u64> {
    let top = take_spare()?;
    if poison::on() {
        poison::handed_out(top);
    }
    Some(top)
}

/// Makes sure a few spare activation stacks exist (boot; `suspend_this_scheduler` uses them).
pub fn reserve_spare_stacks() {
    for _ in 0..SPARE_RESERVE {
        put_spare(new_act_stack());
    }
}

/// Spare activation stacks kept for suspensions (not handed to the VMM's pool).
const SPARE_RESERVE: usize = 4;
