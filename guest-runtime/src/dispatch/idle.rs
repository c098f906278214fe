//! Idling: an idle vCPU spins a while looking for work, then halts (or, with activations, gives
//! its processor back); new work wakes a halted vCPU with a reschedule IPI.

use core::sync::atomic::Ordering;

use crate::activation::{cost, sa};
use crate::alarm;
use crate::arch::cpu::{self, Word};
use crate::arch::rseq;
use crate::sched::{global_len, watch_next, Pending, HALTED, NEXT_POLL_NS, SPINNING};
use crate::{blk, blk_async, config, net, percpu, timer};

use super::spin;

/// Whether anything could give this vCPU work (looks only; takes nothing).
fn work_visible() -> bool {
    cpu::pending() != 0 || work_queued()
}

/// [`work_visible`] but for deferred interrupt work.
pub(crate) fn work_queued() -> bool {
    if sa::queue_nonempty()
        || timer::sleepers_due()
        || blk::completions_ready()
        || net::completions_ready()
    {
        return true;
    }
    let p = percpu::this();
    if !p.is_empty() || !p.next.ptr.load(Ordering::SeqCst).is_null() || global_len() != 0 {
        return true;
    }
    let me = activm_stub::vcpu_id();
    (0..percpu::nr_vcpus()).any(|v| v != me && !percpu::of(v).is_empty())
}

/// Nothing to run: spin a while looking, then halt until an interrupt. Nothing is in flight
/// here (`Word::SchedIdle` = 1): a context the VMM takes in this function is simply dropped.
pub(super) fn idle() {
    sa::backlog_cleared();
    net::ring_deferred_doorbell(true);
    let me = activm_stub::vcpu_id();
    let bit = 1u64 << me;
    cpu::set(Word::SchedIdle, 1);
    SPINNING.fetch_or(bit, Ordering::AcqRel);
    let start = cpu::rdtsc();
    crate::sched::turn_ended(percpu::this(), start);
    // An IPI stamped here last time but taken before the halt (the check saw it) is no sample.
    percpu::this().woken_at.store(0, Ordering::Relaxed);
    // The guest's only running vCPU with only sleepers to wait for, none due soon: no other
    // vCPU can hand it work, and a timer or an interrupt finds it as well after a yield, so
    // it gives the processor back now, not after a spin (a server beside a batch guest spent
    // a tenth of a processor here: `cargo xtask bench latency`).
    // Requests the VMM looks for only at exits (`blk_async::submissions_unseen`): the halt's
    // exit takes them, so halting at once starts them sooner than spinning first.
    let spin = if (yield_until_sleeper().is_some() && sa::is_warm(me))
        || blk_async::submissions_unseen()
    {
        0
    } else {
        spin::ticks(me, config::idle_spin_ticks())
    };
    let mut spin_until = start + spin;
    // While another vCPU hands threads off through its `next` slot, keep spinning (up to this
    // long), ready to take one that stays there: halting would make its next spawn or wake-up
    // pay for a reschedule IPI (~13 us here).
    let spin_limit = start + 20 * spin;
    // Other vCPUs' `next` slots are looked at every `NEXT_POLL_NS` only: each look pulls the
    // line the owner writes at every hand-off.
    let poll = timer::ns_to_ticks(NEXT_POLL_NS);
    let mut next_poll = 0;
    loop {
        if work_visible() {
            if spin != 0 {
                spin::note(me, true);
            }
            SPINNING.fetch_and(!bit, Ordering::AcqRel);
            cpu::set(Word::SchedIdle, 0);
            return;
        }
        let now = cpu::rdtsc();
        if now >= next_poll {
            next_poll = now + poll;
            match watch_next(now) {
                Some(true) => {
                    if spin != 0 {
                        spin::note(me, true);
                    }
                    SPINNING.fetch_and(!bit, Ordering::AcqRel);
                    cpu::set(Word::SchedIdle, 0);
                    return;
                }
                Some(false) => spin_until = spin_until.max((now + spin).min(spin_limit)),
                None => {}
            }
        }
        if now > spin_until {
            if spin != 0 {
                spin::note(me, false);
            }
            break;
        }
        crate::watchdog::tick();
        for _ in 0..16 {
            core::hint::spin_loop();
        }
    }
    HALTED.fetch_or(bit, Ordering::SeqCst);
    SPINNING.fetch_and(!bit, Ordering::AcqRel);
    sa::set_idle(me, true);
    if !work_visible() && watch_next(cpu::rdtsc()).is_none() {
        // Only sleepers, none due soon, and the VMM gives the processor back for them: yield it
        // now (Shenango's idle core goes back at once; the VMM grants one again in time).
        if let Some(wake_ns) = yield_until_sleeper() {
            sa::set_idle(me, false);
            HALTED.fetch_and(!bit, Ordering::AcqRel);
            sa::yield_idle_vcpu(me, wake_ns, work_queued);
            cpu::set(Word::SchedIdle, 0);
            return;
        }
        // Only block requests in flight (and maybe sleepers): offer the processor to the VMM,
        // which brings it back for the first completion (or declines when nobody else wants
        // it: then halt, below).
        if let Some(wake_ns) = yield_for_io() {
            sa::set_idle(me, false);
            HALTED.fetch_and(!bit, Ordering::AcqRel);
            sa::yield_idle_vcpu_for_io(me, wake_ns, work_queued);
            sa::set_idle(me, true);
            HALTED.fetch_or(bit, Ordering::SeqCst);
            if work_visible() || watch_next(cpu::rdtsc()).is_some() {
                sa::set_idle(me, false);
                HALTED.fetch_and(!bit, Ordering::AcqRel);
                cpu::set(Word::SchedIdle, 0);
                return;
            }
        }
        timer::arm_for_sleepers();
        // With activations, a vCPU idle for long enough gives its processor back (Anderson et al. 1992:
        // "this processor is idle"); the guest asks again when work needs it (see
        // `wake_idle_vcpu_after_rmw`). Not while threads sleep: a vCPU that halts arms the
        // timer for them, and the busy ones may not have. With socket waits armed only if the
        // VMM wants a processor back for their reports (`SHARED_FEATURE_YIELD_NET`).
        let yield_after = config::idle_yield_ticks();
        let halted_at = cpu::rdtsc();
        // When this vCPU offers its processor if it is still idle then (`None`: it does not).
        let offer_at = (yield_after != 0
            && config::use_halt()
            && sa::activations_enabled()
            && !timer::has_sleepers()
            && !blk::requests_in_flight()
            && (!net::waits_armed() || sa::net_yield_supported()))
        .then(|| {
            let due = halted_at + yield_after;
            if net::waits_armed() {
                net_offer_at(me, due)
            } else {
                due
            }
        });
        if let Some(at) = offer_at {
            alarm::arm_idle_deadline(at);
        }
        percpu::bump(&percpu::this().counters.halts);
        if config::use_halt() {
            rseq::idle_halt();
            crate::sched::halt_ended(percpu::this(), cpu::rdtsc());
        } else {
            let until = cpu::rdtsc() + config::idle_spin_ticks();
            while !work_visible() && cpu::rdtsc() < until {
                core::hint::spin_loop();
            }
        }
        // (The APIC timer may fire a little before the TSC says: 3/4 of the time is enough.)
        // The idle deadline's own tick leaves PEND_TIMER behind: with no thread and no
        // sleeper it has nothing to do (the next activation here finds it, harmlessly).
        if offer_at.is_some_and(|at| cpu::rdtsc() >= at - yield_after / 4)
            && cpu::pending() & !Pending::Timer.bit() == 0
            && !work_queued()
            && watch_next(cpu::rdtsc()).is_none()
            && !timer::has_sleepers()
        {
            sa::set_idle(me, false);
            HALTED.fetch_and(!bit, Ordering::AcqRel);
            // `SchedIdle` stays set until the yield: if the VMM takes the processor first, the
            // context it hands over must be dropped as an idle scheduler's, never adopted (an
            // adopter would run the `sa_yield` and give its own activation away).
            // With socket waits armed the last processor may go too: the VMM wants one back
            // for the first report (`SHARED_FEATURE_YIELD_NET`), or declines when nobody else
            // wants it.
            if net::waits_armed() {
                sa::yield_idle_vcpu_for_io(me, 0, work_queued);
            } else {
                sa::yield_idle_vcpu(me, 0, work_queued);
            }
            // Returns only if the VMM kept the processor here (or the queue has records).
            cpu::set(Word::SchedIdle, 0);
            return;
        }
    }
    sa::set_idle(me, false);
    HALTED.fetch_and(!bit, Ordering::AcqRel);
    cpu::set(Word::SchedIdle, 0);
}

/// With socket waits armed, a vCPU offers its processor at most once in this long: a server's
/// idle periods are mostly shorter than the idle deadline, whose timer then interrupts the vCPU
/// busy again (~120 us here), and a VMM with nobody else to give the processor to declines the
/// offer (an exit). Paced, an idle server still gives its processors back within this long,
/// and a busy one pays under 1% of a processor.
const NET_OFFER_PACE_NS: u64 = 20_000_000;

/// Per vCPU: the idle deadline it last armed at its due time with socket waits armed (TSC).
static NET_OFFERED_AT: [core::sync::atomic::AtomicU64; 64] =
    [const { core::sync::atomic::AtomicU64::new(0) }; 64];

/// The idle deadline of vCPU `me`, halting with socket waits armed, whose deadline would be
/// `due`: `due` itself (noted) once [`NET_OFFER_PACE_NS`] passed since the last one, else the
/// end of that pace. The deadline is armed either way: a vCPU that halted for good inside the
/// pace, its clients gone, held its processor until the guest ended (until 2026-11-29 it armed
/// none then, and a batch guest beside the server starved in about 1 run in 6).
fn net_offer_at(me: u32, due: u64) -> u64 {
    let slot = &NET_OFFERED_AT[me as usize % NET_OFFERED_AT.len()];
    let last = slot.load(Ordering::Relaxed);
    let paced = last.saturating_add(percpu::ns_to_ticks(NET_OFFER_PACE_NS));
    if last == 0 || due >= paced {
        slot.store(due, Ordering::Relaxed);
        due
    } else {
        paced
    }
}

/// With sleepers only (no I/O in flight), the earliest far enough away and a VMM that wakes
/// yielded vCPUs (`SHARED_FEATURE_YIELD_WAKE`): how long to give the processor back for.
fn yield_until_sleeper() -> Option<u64> {
    if config::idle_yield_ticks() == 0
        || !config::use_halt()
        || !sa::yield_wake_supported()
        || blk::requests_in_flight()
        || (net::waits_armed() && !sa::net_yield_supported())
        || sa::yield_declined_lately()
    {
        return None;
    }
    let gap = timer::ns_until_earliest()?;
    // The warm vCPU wakes the sleepers: the others give their processors back, untimed.
    if !sa::is_warm(activm_stub::vcpu_id()) {
        return Some(0);
    }
    (gap >= cost::yield_min_gap_ns()).then(|| gap.saturating_sub(cost::yield_lead_ns()).max(1))
}

/// With block requests in flight and nothing else to wait for but sleepers, on a VMM that
/// wakes a guest for its completions (`SHARED_FEATURE_YIELD_IO`): the wake-up to ask for (the
/// earliest sleeper, a little early; 0 for none or one too close to bother). Not with socket
/// waits armed: a server offers its processors only after an idle period (below).
fn yield_for_io() -> Option<u64> {
    if config::idle_yield_ticks() == 0
        || !config::use_halt()
        || !sa::io_yield_supported()
        || !blk::requests_in_flight()
        || net::waits_armed()
    {
        return None;
    }
    // The warm vCPU takes the completions and wakes the sleepers: the others give their
    // processors back, untimed.
    if !sa::is_warm(activm_stub::vcpu_id()) {
        return Some(0);
    }
    match timer::ns_until_earliest() {
        Some(gap) if gap < cost::yield_min_gap_ns() => None,
        Some(gap) => Some(gap.saturating_sub(cost::yield_lead_ns()).max(1)),
        None => Some(0),
    }
}
