//! When the net thread interrupts a halted vCPU for the reports it published: not while
//! another vCPU of the guest is busy and takes them at its next scheduler loop
//! (`thread.rs` drives it). It reads the guest's vCPU slots, so it sits beside the net thread,
//! above `Guest`.

use std::mem::offset_of;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::net::NetRing;
use protocol::shared::SharedHeader;

use crate::allocator::Slot;
use crate::guest::Guest;

/// How long reports may wait for a busy vCPU of the guest (running a thread, or spinning for
/// work) to take them at its next scheduler loop before a halted one is interrupted for them.
const BUSY_GRACE: Duration = Duration::from_micros(50);

/// How long an interrupted halted vCPU may take to reach its scheduler loop (an interrupt to
/// a halted vCPU's CPL3 handler takes ~120 us on this host) before another one is woken.
const WAKE_WAIT: Duration = Duration::from_micros(250);

/// How long reports may wait untaken while every vCPU of the guest runs a thread (none idle to
/// interrupt) before a running one is interrupted for them (the reschedule interrupt: the
/// guest's handler preempts its thread for the scheduler loop, which takes them). Without it a
/// thread that computes without a scheduling point kept them from its vCPU until its time slice
/// ended (10 ms). The block device's `nudge_us` default.
const NET_NUDGE: Duration = Duration::from_micros(500);

/// Reports published while another vCPU of the guest was busy: no halted vCPU was interrupted
/// for them. A busy vCPU takes them when it next schedules (a socket reader runs ~1 us), or
/// finds them when it goes idle (it sets its idle bit, then looks at the ring); interrupting a
/// halted vCPU instead costs it an emulated interrupt entry, its run and its next halt (over
/// 100 us of host CPU here) for work the busy one does in microseconds. If they are still
/// there after [`BUSY_GRACE`] (the busy vCPU runs a long thread), a halted one is woken.
#[derive(Default)]
pub(super) struct Unseen {
    since: Option<Instant>,
    /// When this thread last interrupted a halted vCPU (until the guest took the reports):
    /// that vCPU is on its way, and no second one is woken before [`WAKE_WAIT`].
    woke: Option<Instant>,
    /// No vCPU was idle to interrupt when they were due: a running one is, at `since` +
    /// [`NET_NUDGE`].
    none_idle: bool,
}

impl Unseen {
    /// Reports were published (and fenced): wake a halted vCPU unless another one is busy.
    pub(super) fn wake(&mut self, guest: &Guest) {
        if !self.overdue() && some_vcpu_busy(guest) {
            self.since.get_or_insert_with(Instant::now);
            return;
        }
        self.interrupt(guest);
    }

    fn interrupt(&mut self, guest: &Guest) {
        if crate::devices::blk_async::wake_one_idle(guest) {
            self.since = None;
            self.none_idle = false;
            self.woke = Some(Instant::now());
            return;
        }
        // The guest gave every processor back (`SHARED_FEATURE_YIELD_NET`): it wants one, and
        // the new activation takes the reports.
        // Followed up after `WAKE_WAIT`, as an interrupt is.
        if crate::devices::blk_async::want_processor_if_none_held(guest) {
            self.since.get_or_insert_with(Instant::now);
            self.none_idle = false;
            self.woke = Some(Instant::now());
            guest
                .stats
                .socket_reports_woke_guest
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Every vCPU holding a processor runs a thread.
        let since = *self.since.get_or_insert_with(Instant::now);
        self.none_idle = true;
        if since.elapsed() >= NET_NUDGE {
            self.since = None;
            self.none_idle = false;
            if crate::devices::blk_async::wake_one_running(guest) {
                self.woke = Some(Instant::now());
                guest
                    .stats
                    .socket_reports_nudged
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Nothing new published: `consumed` says whether the guest took every report.
    pub(super) fn follow_up(&mut self, guest: &Guest, consumed: bool) {
        if self.since.is_none() {
            return;
        }
        if consumed {
            self.since = None;
            self.woke = None;
            self.none_idle = false;
        } else if self.overdue() || !some_vcpu_busy(guest) {
            self.interrupt(guest);
        }
    }

    /// When deferred reports are due for an interrupt.
    fn deadline(&self) -> Option<Instant> {
        let since = self.since?;
        let woke = self.woke.map_or(since, |w| w + WAKE_WAIT);
        let grace = if self.none_idle {
            NET_NUDGE
        } else {
            BUSY_GRACE
        };
        Some((since + grace).max(woke))
    }

    fn overdue(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// How long the net thread may sleep before [`Unseen::follow_up`] is due.
    pub(super) fn due_in_ns(&self) -> Option<i64> {
        self.deadline().map(|d| {
            d.saturating_duration_since(Instant::now())
                .as_nanos()
                .clamp(1, i64::MAX as u128) as i64
        })
    }
}

/// Whether a vCPU of the guest holds a processor and is not marked idle (it schedules soon).
fn some_vcpu_busy(guest: &Guest) -> bool {
    let idle = guest
        .ram
        .read_u64(guest.plan.shared_area.start + offset_of!(SharedHeader, idle_vcpus) as u64)
        .unwrap_or(u64::MAX);
    let view = guest.procs.alloc.view(guest.id);
    view.vcpus
        .iter()
        .enumerate()
        .any(|(v, s)| v < 64 && idle & (1 << v) == 0 && matches!(s, Slot::Running(_)))
}

/// The guest's `NetRing::tail` (how far it took the reports).
pub(super) fn ring_tail(guest: &Guest, ring: u64) -> Option<u32> {
    guest
        .ram
        .read_bytes(ring + offset_of!(NetRing, tail) as u64, 4)
        .ok()
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}
