//! Time: preemptive round-robin slices and sleeping threads, on each vCPU's local APIC one-shot
//! timer, programmed from CPL3 through the user-mapped xAPIC.
//!
//! An APIC access costs an exit into KVM (~6.5 us here), so the timer is armed only when it has
//! a purpose (another thread waits for this vCPU, or a sleeper is due) and at most once per
//! slice: `Word::Armed` remembers the deadline it is armed for, and voluntary switches never
//! touch the APIC. When it fires, the handler preempts the running thread if its slice is over
//! and something else waits, otherwise re-arms for what is left.
//!
//! Sleepers wait in one global sorted list. The timer is armed `SLEEP_EARLY` before the earliest
//! deadline (it fires ~40 us late on our hosts) and the woken thread spins (yielding) to the
//! exact deadline.
//!
//! **Timed waits** (`Condvar::wait_timeout`) are sleepers too, and also wait in their
//! primitive's wait list: two parties may wake them, so the first to claim the wake-up in
//! `Tcb::timed` (compare-and-swap from [`TIMED_ARMED`], each under the lock of the list it found
//! the thread in) is the only one that wakes it. The timer's claim ([`TIMED_BY_TIMER`]) still
//! lets a notifier win until the waiter, at its deadline, leaves the wait list under that
//! list's lock; a notifier's claim ([`TIMED_NOTIFIED`]) cancels the timeout: the waiter takes
//! itself off the sleepers' list. Nothing polls.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use activm_stub::sync::SpinLock;
use activm_stub::{preempt, IrqFrame};

use crate::arch::context;
use crate::arch::cpu::{self, Word};
use crate::config;
use crate::percpu;
pub use crate::percpu::{ns_to_ticks, ticks_to_ns};
use crate::sched::{self, Pending};
use crate::tcb::{self, Tcb};

/// Sleeps shorter than this spin (yielding) instead of parking.
const SPIN_SLEEP_NS: u64 = 60_000;
/// How early the timer is armed for a sleeper.
const SLEEP_EARLY_NS: u64 = 50_000;
/// The shortest timer period worth programming.
const MIN_ARM_NS: u64 = 5_000;
/// Random preemption re-arms the timer at most this many times in a row while its interrupts
/// are deferred (`on_timer`).
const MAX_DEFERRED_REARMS: u32 = 4;

/// Sleeping threads, earliest deadline first: an intrusive list through `Tcb::sleep_next`
/// (nothing is allocated under the lock; a thread is in it only while it sleeps, so its TCB
/// stays valid).
struct Sleepers(*const Tcb);

// SAFETY: TCB pointers, used under the lock.
unsafe impl Send for Sleepers {}

static SLEEPERS: percpu::Line<SpinLock<Sleepers>> =
    percpu::Line(SpinLock::new(Sleepers(core::ptr::null())));
/// The earliest sleeper deadline (TSC), or `u64::MAX`.
static EARLIEST: AtomicU64 = AtomicU64::new(u64::MAX);

/// `Tcb::timed`: not a timed wait (a plain sleep: only the timer wakes it).
pub const TIMED_NONE: u32 = 0;
/// A timed wait nobody claimed yet.
pub const TIMED_ARMED: u32 = 1;
/// The timer claimed it (its deadline is near) and woke it.
pub const TIMED_BY_TIMER: u32 = 2;
/// A notifier claimed it: not timed out.
pub const TIMED_NOTIFIED: u32 = 3;

/// Inserts `t` (sleeping until `t.sleep_deadline`) in deadline order.
fn insert_sleeper(list: &mut Sleepers, t: &Tcb) {
    let deadline = t.sleep_deadline.get();
    let mut prev: *const Tcb = core::ptr::null();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB.
        let c = unsafe { tcb::from_raw(cur) };
        if c.sleep_deadline.get() > deadline {
            break;
        }
        prev = cur;
        cur = c.sleep_next.get();
    }
    t.sleep_next.set(cur);
    if prev.is_null() {
        list.0 = t;
    } else {
        // SAFETY: as above.
        unsafe { tcb::from_raw(prev) }.sleep_next.set(t);
    }
}

/// Arms this vCPU's timer to interrupt by TSC `deadline` at the latest (the watchdog's hook:
/// it calls from a timer interrupt or a scheduler or lock-wait loop, this vCPU pinned).
pub(crate) fn arm_by(deadline: u64) {
    ensure_armed_by(deadline);
}

/// Arms this vCPU's timer for TSC `deadline` unless it is armed for an earlier one. Call with
/// this vCPU pinned (scheduler context or a preemption hold).
fn ensure_armed_by(deadline: u64) {
    let armed = armed_deadline();
    if armed != 0 && armed <= deadline {
        return;
    }
    let now = cpu::rdtsc();
    let ns = ticks_to_ns(deadline.saturating_sub(now)).max(MIN_ARM_NS);
    percpu::trace(percpu::T_ARM, ns);
    cpu::set(Word::Armed, deadline.max(now + 1));
    cpu::arm_timer_ns(ns);
}

/// The deadline this vCPU's timer is armed for (0: not armed). `Word::Armed` says, unless the
/// timer itself is known to be stopped (`cpu::timer_stopped`: aarch64 reads its control
/// register, no exit). On aarch64 the word was seen left set over a timer the EL1 stub had
/// masked (about 120 times in 30 runs of `rt-tests blk-overlap`; cause not found): the vCPU
/// then never took a timer interrupt again, and a third of those runs hung.
///
/// A deadline the word still holds [`STALE_ARMED_MS`] after it passed is stale too: its
/// interrupt came and went without clearing it (`on_timer` clears the word of the vCPU it runs
/// on, which a nested interrupt after the trampoline's EOI may have moved its thread to). A
/// stale word in the past made every later `ensure_armed_by` believe an earlier deadline was
/// armed: that vCPU never armed its timer again, and halted over its sleepers. Clearing it
/// costs at worst one extra timer interrupt when the real one is merely late.
fn armed_deadline() -> u64 {
    let armed = cpu::get(Word::Armed);
    if armed != 0 && (cpu::timer_stopped() || stale(armed)) {
        cpu::set(Word::Armed, 0);
        return 0;
    }
    armed
}

/// How long past its deadline `Word::Armed` may still hold it before it is taken as stale.
/// The timer fires ~40 us late on our hosts; a vCPU whose host thread waits for a CPU takes it
/// when it runs again, before any of its code can look at the word.
const STALE_ARMED_MS: u64 = 2;

/// [`STALE_ARMED_MS`] in TSC ticks: a multiplication (`ns_to_ticks`'s 128-bit division costs
/// tens of nanoseconds, on every thread made runnable through `ensure_slice_timer`).
fn stale_armed_ticks() -> u64 {
    percpu::tsc_khz() * STALE_ARMED_MS
}

/// Whether `armed`, the word's deadline, is stale (see [`armed_deadline`]); counts it.
fn stale(armed: u64) -> bool {
    let stale = cpu::rdtsc() > armed.saturating_add(stale_armed_ticks());
    if stale {
        percpu::bump(&percpu::this().counters.stale_timer_words);
    }
    stale
}

/// The deadline the timer should fire at for the thread switched in at `slice_start`.
fn wanted_deadline(slice_start: u64) -> Option<u64> {
    let mut deadline = u64::MAX;
    if let Some((min, max)) = config::random_preemption() {
        let span = max.saturating_sub(min).max(1);
        let ns = min + percpu::this().random() % span;
        // (`rdtsc` only here: it costs ~15 ns, on every switch-in otherwise.)
        deadline = cpu::rdtsc() + ns_to_ticks(ns);
    } else if sched::runnable_elsewhere() {
        deadline = slice_start + config::slice_ticks();
    }
    let earliest = EARLIEST.load(Ordering::Acquire);
    if earliest != u64::MAX {
        deadline = deadline.min(earliest.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    }
    (deadline != u64::MAX).then_some(deadline)
}

/// Scheduler, about to switch in a thread at `now`.
pub fn on_switch_in(now: u64) {
    if let Some(deadline) = wanted_deadline(now) {
        ensure_armed_by(deadline);
    }
}

/// Thread context, after making a thread runnable here: the running thread's slice must end.
pub fn ensure_slice_timer() {
    let armed = cpu::get(Word::Armed);
    if armed != 0 && !cpu::timer_stopped() && cpu::rdtsc() <= armed + stale_armed_ticks() {
        return;
    }
    let hold = preempt::Hold::new();
    let cur = sched::current_raw();
    if !cur.is_null() && armed_deadline() == 0 {
        // SAFETY: the running thread's TCB.
        let start = unsafe { tcb::from_raw(cur) }
            .slice_start
            .load(Ordering::Relaxed);
        ensure_armed_by(start + config::slice_ticks());
    }
    drop(hold);
}

/// Makes sure this vCPU's timer ticks by TSC `deadline` (a backlog's ask delay ends then).
pub fn tick_by(deadline: u64) {
    let hold = preempt::Hold::new();
    ensure_armed_by(deadline);
    drop(hold);
}

/// Scheduler, before halting: wake up for the earliest sleeper.
pub fn arm_for_sleepers() {
    let earliest = EARLIEST.load(Ordering::Acquire);
    if earliest != u64::MAX {
        ensure_armed_by(earliest.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    }
}

/// Whether any thread sleeps (or waits with a timeout).
pub fn has_sleepers() -> bool {
    EARLIEST.load(Ordering::Acquire) != u64::MAX
}

/// Nanoseconds until the earliest sleeper is due (0 if one is due; `None` without sleepers).
pub fn ns_until_earliest() -> Option<u64> {
    let earliest = EARLIEST.load(Ordering::Acquire);
    (earliest != u64::MAX).then(|| ticks_to_ns(earliest.saturating_sub(cpu::rdtsc())))
}

/// Scheduler, before halting idle: wake up at TSC `deadline` at the latest.
pub fn arm_idle_deadline(deadline: u64) {
    ensure_armed_by(deadline);
}

/// Whether a sleeper is due (within the early margin).
#[inline]
pub fn sleepers_due() -> bool {
    let earliest = EARLIEST.load(Ordering::Relaxed);
    earliest != u64::MAX && earliest <= cpu::rdtsc() + ns_to_ticks(SLEEP_EARLY_NS)
}

/// Wakes every due sleeper (they become runnable on this vCPU).
pub fn wake_due() {
    let limit = cpu::rdtsc() + ns_to_ticks(SLEEP_EARLY_NS);
    let due = {
        let mut list = SLEEPERS.lock();
        // Cut the due prefix off; keep those whose wake-up the timer claims (a notifier may
        // have claimed a timed waiter first: it is only dropped from the list, not touched
        // again once the lock is released).
        let mut due: *const Tcb = core::ptr::null();
        let mut due_tail: *const Tcb = core::ptr::null();
        let mut cur = list.0;
        while !cur.is_null() {
            // SAFETY: a sleeping thread's TCB.
            let c = unsafe { tcb::from_raw(cur) };
            if c.sleep_deadline.get() > limit {
                break;
            }
            let next = c.sleep_next.get();
            let claimed = c.timed.load(Ordering::Acquire) == TIMED_NONE
                || c.timed
                    .compare_exchange(
                        TIMED_ARMED,
                        TIMED_BY_TIMER,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok();
            if claimed {
                c.sleep_next.set(core::ptr::null());
                if due_tail.is_null() {
                    due = cur;
                } else {
                    // SAFETY: a TCB this loop took.
                    unsafe { tcb::from_raw(due_tail) }.sleep_next.set(cur);
                }
                due_tail = cur;
            }
            cur = next;
        }
        list.0 = cur;
        update_earliest(&list);
        due
    };
    let mut cur = due;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB whose wake-up is ours (it cannot exit before it is
        // woken); read the link before the wake-up hands the TCB back to its thread.
        let t = unsafe { tcb::from_raw(cur) };
        cur = t.sleep_next.get();
        sched::wake(t);
    }
}

/// The timer interrupt.
pub fn on_timer(frame: &mut IrqFrame) {
    cpu::set(Word::Armed, 0);
    percpu::trace(percpu::T_TIMER, context::frame_pc(frame));
    crate::watchdog::check(context::frame_pc(frame));
    percpu::bump(&percpu::this().counters.timer_irqs);
    crate::upcall::sim_on_interrupt(frame);
    if !sched::irq_prologue(frame) {
        Pending::Timer.defer();
        if let Some((min, _)) = config::random_preemption() {
            // Keep interrupting at random points even while deferring (tests), a few times:
            // where an interrupt takes longer to deliver than `min` (~120 us on some kvm_pvm
            // hosts), each re-arm nested the next interrupt inside this one until the stack
            // overflowed (`rt-tests std-cases-preempted`).
            let deferrals = &percpu::this().timer_deferrals;
            if deferrals.fetch_add(1, Ordering::Relaxed) < MAX_DEFERRED_REARMS {
                ensure_armed_by(cpu::rdtsc() + ns_to_ticks(min));
            }
        }
        return;
    }
    percpu::this().timer_deferrals.store(0, Ordering::Relaxed);
    tick_in_thread();
    // Anything a nested interrupt deferred meanwhile.
    sched::safepoint();
}

/// A timer tick for the running thread (clean thread context): wake sleepers, then preempt the
/// thread if its slice is over and another waits, or re-arm.
pub fn tick_in_thread() {
    // Not under a preemption hold: `wake_due` may spin for the sleepers' lock, and a vCPU that
    // spins holding one defers its upcalls, so it could never take the record that continues
    // the lock's preempted holder (found by the soak: the guest stalled with that record in
    // the spinning vCPU's queue).
    if sleepers_due() {
        wake_due();
    }
    if crate::upcall::backlog_waiting() && crate::upcall::some_yielded() {
        if sched::work_queued() {
            crate::upcall::want_processors();
        } else {
            crate::upcall::backlog_cleared();
        }
    }
    let hold = preempt::Hold::new();
    let cur = sched::current();
    let start = cur.slice_start.load(Ordering::Relaxed);
    let now = cpu::rdtsc();
    let expired =
        config::random_preemption().is_some() || now.saturating_sub(start) >= config::slice_ticks();
    let preempt = expired && sched::runnable_elsewhere();
    if preempt {
        // The next thread gets a fresh timer when it is switched in.
    } else if let Some(deadline) = wanted_deadline(start) {
        ensure_armed_by(deadline.max(now + ns_to_ticks(MIN_ARM_NS)));
    }
    drop(hold);
    if preempt {
        sched::preempt_current();
    }
}

/// Sets `EARLIEST` from the list's head (under the lock).
fn update_earliest(list: &Sleepers) {
    let next = if list.0.is_null() {
        u64::MAX
    } else {
        // SAFETY: a sleeping thread's TCB.
        unsafe { tcb::from_raw(list.0) }.sleep_deadline.get()
    };
    EARLIEST.store(next, Ordering::Release);
    crate::upcall::sa::publish_earliest_sleeper(next);
}

/// The TSC deadline `d` from now (saturating far in the future).
pub fn deadline_in(d: Duration) -> u64 {
    let ns = d.as_nanos().min(u128::from(u64::MAX / 4)) as u64;
    cpu::rdtsc().saturating_add(ns_to_ticks(ns))
}

/// Puts `me` (the current thread, after `prepare_wait`, with `timed` set) on the sleepers'
/// list until TSC `deadline`, and makes sure this vCPU's timer fires for it.
pub fn add_sleeper(me: &Tcb, deadline: u64) {
    me.sleep_deadline.set(deadline);
    {
        let mut list = SLEEPERS.lock();
        insert_sleeper(&mut list, me);
        EARLIEST.fetch_min(deadline, Ordering::AcqRel);
        crate::upcall::sa::publish_earliest_sleeper(EARLIEST.load(Ordering::Acquire));
    }
    let hold = preempt::Hold::new();
    ensure_armed_by(deadline.saturating_sub(ns_to_ticks(SLEEP_EARLY_NS)));
    drop(hold);
}

/// Takes `me` off the sleepers' list if it is still there (a timed wait a notifier ended).
pub fn remove_sleeper(me: &Tcb) {
    let target = me as *const Tcb;
    let mut list = SLEEPERS.lock();
    let mut prev: *const Tcb = core::ptr::null();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: a sleeping thread's TCB.
        let c = unsafe { tcb::from_raw(cur) };
        let next = c.sleep_next.get();
        if cur == target {
            if prev.is_null() {
                list.0 = next;
                update_earliest(&list);
            } else {
                // SAFETY: as above.
                unsafe { tcb::from_raw(prev) }.sleep_next.set(next);
            }
            return;
        }
        prev = cur;
        cur = next;
    }
}

/// Spins (yielding to other threads) until TSC `deadline` or until `stop()`.
pub fn spin_until(deadline: u64, mut stop: impl FnMut() -> bool) {
    while cpu::rdtsc() < deadline && !stop() {
        if sched::runnable_elsewhere() {
            sched::yield_current();
        } else {
            core::hint::spin_loop();
            preempt::check_pending();
        }
    }
}

/// `thread::sleep`: parks the current thread until `d` has passed.
pub fn sleep(d: Duration) {
    let deadline = deadline_in(d);
    if d.as_nanos() >= u128::from(SPIN_SLEEP_NS) {
        let me = sched::current();
        me.prepare_wait();
        add_sleeper(me, deadline);
        sched::wait(me);
    }
    spin_until(deadline, || false);
}
