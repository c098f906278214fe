//! One thread waiting for the first of several readiness sources (`poll` of several
//! descriptors): a tag per source, all recorded for the same thread, parked once, with or
//! without a deadline, holding no processor.
//!
//! Every source reports its tag like any socket wait: the VMM through the ring (a receive
//! buffer's or transmit ring's `waiter` word, a `poll` call armed under the tag), or the guest
//! itself ([`crate::net::report_local`], an `eventfd` write). The first report's claim
//! (`Tcb::timed`, `TIMED_ARMED -> TIMED_NOTIFIED`, as for a wait with a deadline) wakes the
//! thread; later reports of the same wait find it claimed and wake nobody. So the wait is
//! always armed, with the deadline on the sleepers' list or, without one, armed only.
//!
//! Once woken the thread takes each tag back: a source that never took it gives it back now
//! ([`AnyWait::release`]); one whose report is in the ring or on its way gets the tag given up
//! ([`AnyWait::abandon`]): that report frees it and wakes nobody (the claims are made under
//! the ring consumer's lock, so a report already taken has freed nothing yet and the tag is
//! freed at once). After [`AnyWait::end`] no report of the wait touches the thread.

use core::sync::atomic::Ordering;

use crate::net::{abandon, free_tag, ring_ready, take_tag, WAITERS};
use crate::sync::timed;
use crate::tcb::Tcb;
use crate::{sched, timer};

/// Whether the VMM can report tags (its ring is registered): else only guest-local sources
/// can be waited for.
pub fn vmm_reports() -> bool {
    ring_ready()
}

/// A wait for the first of several sources; see the module.
#[derive(Debug)]
pub struct AnyWait {
    me: &'static Tcb,
    deadline: Option<u64>,
}

impl AnyWait {
    /// Arms a wait of the current thread until TSC `deadline` (`None`: none). Sources the VMM
    /// reports need its ring ([`vmm_reports`]); guest-local ones do not.
    ///
    /// Between this and [`AnyWait::park`] the thread must not wait for anything else (no
    /// lock that parks, no allocation).
    pub fn begin(deadline: Option<u64>) -> AnyWait {
        let me = sched::current();
        match deadline {
            Some(d) => timed::arm(me, d),
            None => {
                me.prepare_wait();
                me.timed.store(timer::TIMED_ARMED, Ordering::Release);
            }
        }
        AnyWait { me, deadline }
    }

    /// A free tag for one more source, recorded for this thread (`None`: every tag is taken).
    pub fn tag(&self) -> Option<u32> {
        let tag = take_tag()?;
        WAITERS[tag as usize].store(self.me as *const Tcb as *mut Tcb, Ordering::Release);
        Some(tag)
    }

    /// Parks until the first report or the deadline; with `ready` (a source was found ready,
    /// or the caller gives up) only takes the wake-up that a claim already made owes.
    pub fn park(&self, ready: bool) {
        if ready && timed::take_armed(self.me) {
            return; // claimed by ourselves: nobody wakes us
        }
        sched::wait(self.me);
    }

    /// `tag`'s source gave it back (no report of it will come).
    pub fn release(&self, tag: u32) {
        WAITERS[tag as usize].store(core::ptr::null_mut(), Ordering::Relaxed);
        free_tag(tag);
    }

    /// `tag`'s report is in the ring or on its way: it frees the tag and wakes nobody.
    pub fn abandon(&self, tag: u32) {
        abandon(tag);
    }

    /// After [`AnyWait::park`] and every tag released or abandoned: leaves the sleepers' list.
    /// Whether the deadline passed (a timer that fired a little early is waited out).
    pub fn end(self) -> bool {
        let Some(deadline) = self.deadline else {
            self.me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
            return false;
        };
        let by_timer = self.me.timed.load(Ordering::Acquire) == timer::TIMED_BY_TIMER;
        timer::remove_sleeper(self.me);
        self.me.timed.store(timer::TIMED_NONE, Ordering::Relaxed);
        if by_timer {
            timer::spin_until(deadline, || false);
        }
        crate::net_deadline::passed(deadline)
    }
}
