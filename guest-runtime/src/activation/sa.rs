//! The shared area (`protocol::shared`) and the `sa_*` calls: turning activations on, asking
//! for processors and giving them back.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::hypercall::{Hypercall, SA_YIELD_DECLINED};
use activm_stub::protocol::shared::{
    SharedHeader, VcpuArea, VcpuRunState, SHARED_FEATURE_YIELD_IO, SHARED_FEATURE_YIELD_NET,
    SHARED_FEATURE_YIELD_WAKE,
};

use crate::arch::cpu::{self, Word};
use crate::percpu;

static ENABLED: AtomicBool = AtomicBool::new(false);
static SHARED: AtomicU64 = AtomicU64::new(0);

/// Whether the VMM delivers upcalls to this guest.
pub fn activations_enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// Whether the shared area is known (diagnostics).
pub(crate) fn mapped() -> bool {
    SHARED.load(Ordering::Relaxed) != 0
}

pub(crate) fn header() -> &'static SharedHeader {
    // SAFETY: the shared area's first page is the header, mapped for the guest's lifetime.
    unsafe { &*(SHARED.load(Ordering::Relaxed) as *const SharedHeader) }
}

pub(crate) fn area(vcpu: u32) -> &'static VcpuArea {
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

/// Publishes the TSC deadline of the earliest sleeping thread (`u64::MAX`: none) in the shared
/// header, for the VMM: a timed wake-up it finds made redundant (its sleepers are awake) is moved
/// to the next sleeper. Call under the sleepers' lock, so the last value written is the list's.
pub fn publish_earliest_sleeper(deadline: u64) {
    if SHARED.load(Ordering::Relaxed) == 0 {
        return;
    }
    header().earliest_sleeper.store(deadline, Ordering::Release);
}

/// Publish the runtime's self-description for the VMM's hang report (`crate::diag`).
pub(crate) fn publish_runtime_diag(at: u64) {
    if SHARED.load(Ordering::Relaxed) != 0 {
        header().runtime_diag.store(at, Ordering::Release);
    }
}

/// vCPU 0, at boot: where the shared area is.
pub fn init() {
    SHARED.store(activm_stub::boot_info().shared_area, Ordering::Release);
    publish_earliest_sleeper(u64::MAX);
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

pub(crate) fn hypercall(nr: Hypercall, a0: u64) -> u64 {
    // SAFETY: the sa_* calls take numbers or the address of a function of this image.
    unsafe { activm_stub::hypercall::raw(nr as u64, a0, 0, 0, 0) }
}

/// Records whether the VMM delivers upcalls (`activation::enable`).
pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Release);
}

/// Asks the VMM to give this guest `n` processors (`sa_setconcurrency`); returns the previous
/// value, or `None` without activations.
pub fn set_concurrency(n: u32) -> Option<u32> {
    if !activations_enabled() {
        return None;
    }
    header().requested_concurrency.store(n, Ordering::Release);
    UNASKED.store(0, Ordering::SeqCst);
    Some(hypercall(Hypercall::SaSetConcurrency, u64::from(n)) as u32)
}

/// The guest's warm vCPU, as its id + 1 (0: none): the one running vCPU that keeps its
/// processor, idle, for a sleeper due sooner than a transfer out and back would take
/// (`cost::yield_min_gap_ns`); every other idle vCPU gives its processor back at once. Two
/// idle vCPUs that each counted the other as running gave both processors back.
static WARM: AtomicU32 = AtomicU32::new(0);

/// Whether idle vCPU `me` is the guest's warm vCPU: it is, or takes the role from nobody or
/// from a vCPU that no longer runs.
pub fn is_warm(me: u32) -> bool {
    let warm = WARM.load(Ordering::Acquire);
    if warm == me + 1 {
        return true;
    }
    if warm != 0
        && warm - 1 < percpu::nr_vcpus()
        && area(warm - 1).state.load(Ordering::Acquire) == VcpuRunState::Running as u32
    {
        return false;
    }
    WARM.compare_exchange(warm, me + 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// vCPUs that gave their processor back idle and have not started a new activation since.
static YIELDED: AtomicU64 = AtomicU64::new(0);
/// A processor was given back (`sa_yield`) since this guest last asked: the VMM's demand for
/// it is below its concurrency until the next ask. A `sa_yield` sets that demand to what the
/// guest then holds less one, forgetting vCPUs taken away meanwhile (PREEMPTED: their threads
/// go on elsewhere, the vCPUs stay parked), and a new activation on the yielded vCPU (a timed
/// wake-up, a completion owed a processor) raises it by that one only. So a yielded vCPU
/// started again clears its [`YIELDED`] bit, not this: with only that bit to go by, a guest
/// whose every yielded vCPU had come back and been preempted never asked again, and ran on
/// one processor for the rest of a chaos soak (`rt-tests chaos-soak`, 3-5% of runs: 3-300
/// PREEMPTED records in 20 s against 650-3600).
///
/// Counted, not a flag: an offer the VMM declines (it returns) takes its mark back, without
/// erasing another vCPU's yield made meanwhile. Left set by declined offers, it made every
/// backlog of a lone server arm a timer and ask again: 15-25% fewer requests per second
/// (`docs/net.md`, "A declined offer is no yield").
static UNASKED: AtomicU32 = AtomicU32::new(0);
/// TSC of the last time this guest asked for its processors back.
static LAST_ASK: AtomicU64 = AtomicU64::new(0);
/// At most one ask per this many ns: an ask may come to nothing (its new activation canceled
/// under a revoke, or a yield that lost to a preemption), so asking again must stay possible.
const ASK_INTERVAL_NS: u64 = 1_000_000;

/// Whether the VMM gives a processor back at the time `sa_yield(wake_ns)` asks for
/// (`SHARED_FEATURE_YIELD_WAKE`): then a vCPU may yield while threads sleep.
pub fn yield_wake_supported() -> bool {
    activations_enabled() && header().features & SHARED_FEATURE_YIELD_WAKE != 0
}

/// Scheduler of an idle vCPU: gives its processor back to the VMM (`sa_yield`) unless records
/// wait in its queue or it is the only vCPU running and no wake-up is asked for (`wake_ns` 0;
/// else the VMM starts a new activation `wake_ns` later at the latest, for a sleeper). The
/// activation ends there; the next NEWPROC on this vCPU names it and its stack is recycled
/// then (see `drain::new_proc`). Returns if it did not yield. `work_queued` says whether
/// anything could give this vCPU work (the scheduler's look, `dispatch::idle::work_queued`).
pub fn yield_idle_vcpu(me: u32, wake_ns: u64, work_queued: impl Fn() -> bool) {
    if wake_ns == 0 && granted_vcpus() < 2 {
        return;
    }
    if give_back(me, wake_ns, work_queued) == SA_YIELD_DECLINED {
        DECLINED_AT.store(cpu::rdtsc().max(1), Ordering::Relaxed);
    }
}

/// Whether the VMM takes a processor back while block requests are in flight and wakes the
/// guest for their completions (`SHARED_FEATURE_YIELD_IO`).
pub fn io_yield_supported() -> bool {
    activations_enabled() && header().features & SHARED_FEATURE_YIELD_IO != 0
}

/// Whether the VMM takes a processor back while socket waits are armed and wakes the guest
/// for their reports (`SHARED_FEATURE_YIELD_NET`).
pub fn net_yield_supported() -> bool {
    activations_enabled() && header().features & SHARED_FEATURE_YIELD_NET != 0
}

/// When the VMM last declined a yield (it keeps the processor: nobody else wanted it while
/// I/O is in flight, or it is a latency-critical guest's last one), in TSC ticks.
static DECLINED_AT: AtomicU64 = AtomicU64::new(0);
/// After a declined yield, the guest's only running vCPU halts for this long before it offers
/// its processor again.
const DECLINED_FOR_NS: u64 = 2_000_000;

/// Whether an idle vCPU should halt without offering its processor: the VMM declined a yield
/// lately and this is the guest's only running vCPU (a decline says nothing about a second
/// one: the VMM keeps a latency-critical guest's last processor only).
pub fn yield_declined_lately() -> bool {
    let declined = DECLINED_AT.load(Ordering::Relaxed);
    declined != 0
        && granted_vcpus() <= 1
        && cpu::rdtsc().saturating_sub(declined) < crate::percpu::ns_to_ticks(DECLINED_FOR_NS)
}

/// Scheduler of a vCPU idle while block requests are in flight (`SHARED_FEATURE_YIELD_IO`):
/// offers its processor to the VMM, to be back when a completion is due or after `wake_ns`
/// (0: no sleeper). Returns if it did not yield; the caller halts then. `work_queued`: as in
/// [`yield_idle_vcpu`].
pub fn yield_idle_vcpu_for_io(me: u32, wake_ns: u64, work_queued: impl Fn() -> bool) {
    if yield_declined_lately() {
        return;
    }
    if give_back(me, wake_ns, work_queued) == SA_YIELD_DECLINED {
        DECLINED_AT.store(cpu::rdtsc().max(1), Ordering::Relaxed);
    }
}

/// `sa_yield(wake_ns)` unless records wait or work appeared; the hypercall's result (0 if not
/// made).
fn give_back(me: u32, wake_ns: u64, work_queued: impl Fn() -> bool) -> u64 {
    if !activations_enabled() || queue_nonempty() {
        return 0;
    }
    let bit = 1u64 << me;
    YIELDED.fetch_or(bit, Ordering::SeqCst);
    // A waker that published work before seeing this bit found no idle vCPU and did not ask
    // for processors (`want_processors`): look once more now that the bit is visible (both
    // sides store, then load, with a full barrier between).
    if work_queued() {
        YIELDED.fetch_and(!bit, Ordering::AcqRel);
        return 0;
    }
    percpu::bump(&percpu::this().counters.idle_yields);
    UNASKED.fetch_add(1, Ordering::SeqCst);
    super::cost::note_timed_yield(me, wake_ns);
    let _ = WARM.compare_exchange(me + 1, 0, Ordering::AcqRel, Ordering::Relaxed);
    let now = cpu::rdtsc().max(1);
    let before = GIVEN_AT.swap(now, Ordering::Relaxed);
    let result = hypercall(Hypercall::SaYield, wake_ns);
    // Still here: the VMM kept the processor (declined, or upcalls are off after all).
    let _ = GIVEN_AT.compare_exchange(now, before, Ordering::Relaxed, Ordering::Relaxed);
    super::cost::note_timed_yield(me, 0);
    // Not given back: take the mark back, unless an ask cleared it meanwhile.
    let _ = UNASKED.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    YIELDED.fetch_and(!bit, Ordering::AcqRel);
    result
}

/// When a vCPU of this guest last gave its processor to the VMM and the VMM took it (TSC; 0:
/// never). A guest with sockets or block requests in flight has its offer declined unless
/// another guest wants the processor; any other guest's yield is always taken.
static GIVEN_AT: AtomicU64 = AtomicU64::new(0);
/// How long after a processor was taken the guest counts as sharing the machine.
const CONTENDED_FOR_MS: u64 = 1_000;

/// Whether the VMM took a processor this guest offered within the last second: for a server,
/// another guest wanted it; a processor given back comes back only through an ask.
pub fn processors_contended() -> bool {
    // On every thread wake-up that finds a halted sibling: a multiplication, not
    // `ns_to_ticks`'s 128-bit division.
    let given = GIVEN_AT.load(Ordering::Relaxed);
    given != 0 && cpu::rdtsc().saturating_sub(given) < crate::percpu::tsc_khz() * CONTENDED_FOR_MS
}

/// Nothing waits for a processor (any more): the ask delay starts again with the next backlog.
pub fn backlog_cleared() {
    if BACKLOG_SINCE.load(Ordering::Relaxed) != 0 {
        BACKLOG_SINCE.store(0, Ordering::Relaxed);
    }
}

/// Whether work has been waiting for a processor (the ask delay runs).
pub fn backlog_waiting() -> bool {
    BACKLOG_SINCE.load(Ordering::Relaxed) != 0
}

/// Whether some vCPU gave its processor back idle, or did since the last ask (two loads: cheap
/// to ask on every loop).
pub fn some_yielded() -> bool {
    YIELDED.load(Ordering::Relaxed) != 0 || UNASKED.load(Ordering::Relaxed) != 0
}

/// Since when work waits here with no idle vCPU to take it (TSC; 0: nothing waits).
static BACKLOG_SINCE: AtomicU64 = AtomicU64::new(0);

/// Work is waiting and no vCPU idles here to take it: if some gave their processors back (or
/// did since the last ask: [`UNASKED`]), ask the VMM for them again (`sa_setconcurrency`),
/// once the work has waited the ask delay, and at most once a millisecond.
pub fn want_processors() {
    if YIELDED.load(Ordering::SeqCst) == 0 && UNASKED.load(Ordering::SeqCst) == 0 {
        return;
    }
    let now = cpu::rdtsc();
    let delay = super::cost::ask_delay_ticks();
    if delay != 0 {
        let since = BACKLOG_SINCE.load(Ordering::Relaxed);
        if since == 0 {
            if BACKLOG_SINCE
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                crate::alarm::tick_by(now + delay);
            }
            return;
        }
        if now.saturating_sub(since) < delay {
            return;
        }
    }
    let last = LAST_ASK.load(Ordering::Relaxed);
    if now.saturating_sub(last) < crate::percpu::ns_to_ticks(ASK_INTERVAL_NS)
        || LAST_ASK
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let n = header().requested_concurrency.load(Ordering::Acquire);
    let n = if n == 0 { percpu::nr_vcpus() } else { n };
    super::cost::note_ask();
    // Before the call: a yield after it marks again.
    UNASKED.store(0, Ordering::SeqCst);
    hypercall(Hypercall::SaSetConcurrency, u64::from(n));
}

/// How many processors the VMM's allocator grants this guest now (0 without activations).
/// `SharedHeader::granted_vcpus` is only written at boot by the VMM of this writing, so this
/// counts the vCPUs whose state the VMM says is running.
pub fn granted_vcpus() -> u32 {
    if !activations_enabled() {
        return 0;
    }
    (0..percpu::nr_vcpus())
        .filter(|&v| area(v).state.load(Ordering::Acquire) == VcpuRunState::Running as u32)
        .count() as u32
}

/// A new activation started on vCPU `vcpu`: it no longer counts as given back.
pub(crate) fn note_new_activation(vcpu: u32) {
    super::cost::note_new_activation(vcpu);
    YIELDED.fetch_and(!(1u64 << vcpu.min(63)), Ordering::AcqRel);
}

/// Delivers a USER upcall to vCPU `vcpu` (`sa_preempt`); false without activations.
pub fn preempt_vcpu(vcpu: u32) -> bool {
    activations_enabled() && hypercall(Hypercall::SaPreempt, u64::from(vcpu)) == 0
}
