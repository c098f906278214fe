//! Where an upcall record goes: into the queue of a running vCPU (not the one the event is
//! about) with the upcall interrupt, or pending until a new activation or a vCPU that runs;
//! and the quantum's retry of events that found no room. How a record is written is
//! `activation/records.rs`.

use std::sync::atomic::Ordering;

use protocol::shared::UpcallKind;

use crate::activation::{upcall_name, Event, QueueError};
use crate::allocator::Slot;
use crate::arch::current as arch;
use crate::guest::Guest;
use crate::vm::Outcome;

/// How long a guest's upcall queues may stay without room before the guest is stopped.
pub const UPCALL_STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long records may wait untaken, the consumer index unmoved, in the queue of a running
/// vCPU before the watchdog kicks it to check for an undelivered upcall interrupt.
pub const UPCALL_WATCH_BOUND: std::time::Duration = std::time::Duration::from_millis(5);

impl Guest {
    /// Each vCPU's state (its allocator slot), for fault reports.
    /// The guest's upcall machinery and its vCPUs' slots, for a fault report.
    pub fn describe_upcalls(&self) -> String {
        format!(
            "{}\n  allocator: {}",
            self.acts.describe(self.shared()),
            self.describe_vcpus()
        )
    }

    fn describe_vcpus(&self) -> String {
        let view = self.procs.alloc.view(self.id);
        view.vcpus
            .iter()
            .enumerate()
            .map(|(i, slot)| format!("vCPU {i} {slot:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A vCPU that holds a processor and is not being revoked, other than `except`.
    pub fn running_vcpu(&self, except: Option<u32>) -> Option<u32> {
        let view = self.procs.alloc.view(self.id);
        view.vcpus
            .iter()
            .enumerate()
            .find(|(i, s)| matches!(s, Slot::Running(_)) && Some(*i as u32) != except)
            .map(|(i, _)| i as u32)
    }

    /// Running vCPUs the guest marks idle (`SharedHeader::idle_vcpus`).
    fn idle_running_vcpus(&self) -> u64 {
        std::sync::atomic::fence(Ordering::SeqCst);
        let idle = self.shared().idle_vcpus();
        let view = self.procs.alloc.view(self.id);
        view.vcpus
            .iter()
            .enumerate()
            .filter(|&(i, s)| i < 64 && matches!(s, Slot::Running(_)) && idle & (1 << i) != 0)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// A running vCPU marked idle.
    fn idle_running_vcpu(&self) -> Option<u32> {
        let mask = self.idle_running_vcpus();
        (mask != 0).then(|| mask.trailing_zeros())
    }

    /// Whether an UNBLOCKED record (not bound to its BLOCKED's queue) should wait pending
    /// rather than go out now with the upcall interrupt: every running vCPU is busy, so the
    /// interrupt would only preempt a computing thread, through the guest's CPL0 path
    /// (emulated on our hosts, tens of microseconds), to run this one first. Pending, it goes
    /// out with the next new activation of the guest (every request that blocks starts one),
    /// ahead of the next delivered record, to a vCPU that yields, or with the quantum's retry
    /// (with the interrupt), whichever comes first. Some vCPU must run: otherwise the
    /// guest wants a processor for it (`deliver`).
    fn unblocked_for_later(&self, event: &Event) -> bool {
        if !self.acts.enabled()
            || self.idle_running_vcpus() != 0
            || self.running_vcpu(None).is_none()
        {
            return false;
        }
        self.stats.quiet_unblocked.fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.instant(self.id, event.vcpu, "UNBLOCKED pending", 0);
        }
        true
    }

    /// Keep `event` pending, without interrupting anyone: it goes out with the next new
    /// activation, ahead of the next delivered event, or with the next quantum's retry.
    pub fn post_pending(&self, event: Event) {
        let kind = event.kind;
        match self.acts.post(self.shared(), event, None) {
            Ok(_) => {
                self.stats.upcalls[kind as usize].fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => self.finish(Outcome::fault(
                0,
                format!(
                    "the guest does not consume its upcalls: {} events pending",
                    self.acts.pending()
                ),
            )),
        }
    }

    /// Hand `event` to the guest: into the queue of a running vCPU (not `event.vcpu`) with the
    /// upcall interrupt, or pending until the next new activation. A guest that lets its queues
    /// fill up is stopped.
    pub fn deliver(&self, event: Event) {
        let kind = event.kind;
        let target = match kind {
            // USER goes to the vCPU it names (the caller checked it runs).
            UpcallKind::User => Some(event.vcpu),
            UpcallKind::Signal => self.running_vcpu(None),
            // Behind its BLOCKED record, in the same queue, while that queue's vCPU runs (the
            // blocked vCPU itself, if it went on as a new activation). Else a vCPU that idles;
            // if none does, see `unblocked_for_later`.
            UpcallKind::Unblocked => {
                let behind_blocked =
                    self.acts
                        .blocked_record_queue(event.activation)
                        .filter(|&v| {
                            matches!(
                                self.procs.alloc.view(self.id).vcpus.get(v as usize),
                                Some(Slot::Running(_))
                            )
                        });
                if behind_blocked.is_none() && self.unblocked_for_later(&event) {
                    self.post_pending(event);
                    return;
                }
                behind_blocked
                    .or_else(|| self.idle_running_vcpu())
                    .or_else(|| self.running_vcpu(None))
            }
            _ => self.running_vcpu(Some(event.vcpu)),
        };
        if target.is_none() && self.acts.enabled() {
            // It gave every processor back: it wants one again for this event.
            self.procs.revoke(self.procs.alloc.want_one(self.id));
        }
        let posted = self.acts.post(self.shared(), event, target);
        if posted.is_ok() {
            // Counted once, when it is written now or pending for the next activation.
            self.stats.upcalls[kind as usize].fetch_add(1, Ordering::Relaxed);
        }
        match posted {
            Ok(Some(vcpu)) => {
                if let Some(trace) = &self.trace {
                    trace.instant(self.id, vcpu, upcall_name(kind), 0);
                }
                self.send_upcall_interrupt(vcpu);
            }
            Ok(None) => {
                // Its target's activation ended meanwhile: to another running vCPU, or a
                // processor is wanted for it.
                if target.is_some() {
                    match self.running_vcpu(target) {
                        Some(vcpu) => self.flush_pending(vcpu),
                        None => self.procs.revoke(self.procs.alloc.want_one(self.id)),
                    }
                }
            }
            Err(QueueError::Full) => self.finish(Outcome::fault(
                target.unwrap_or(0),
                format!(
                    "the guest does not consume its upcalls, or corrupted its queue indices: \
                     no room in vCPU {}'s queue ({} events pending)",
                    target.unwrap_or(0),
                    self.acts.pending()
                ),
            )),
            Err(QueueError::Memory(e)) => {
                self.finish(Outcome::fault(0, format!("upcall queue: {e}")))
            }
        }
    }
    /// Raise the upcall interrupt on `vcpu` (counted for the watchdog's second look).
    fn send_upcall_interrupt(&self, vcpu: u32) {
        self.vcpus[vcpu as usize]
            .upcall_interrupts
            .fetch_add(1, Ordering::Relaxed);
        if let Err(e) = arch::send_upcall_interrupt(&self.vm, vcpu) {
            self.finish(Outcome::fault(
                vcpu,
                format!("cannot send the upcall interrupt: {e}"),
            ));
        }
    }

    /// Events that waited for a running vCPU go to `vcpu`, which is about to run or runs.
    pub fn flush_pending(&self, vcpu: u32) {
        if self.acts.pending() == 0 {
            return;
        }
        match self.acts.flush_pending(self.shared(), vcpu) {
            Ok(0) => {}
            Ok(_) => self.send_upcall_interrupt(vcpu),
            Err(e) => self.finish(Outcome::fault(vcpu, format!("upcall queue: {e:?}"))),
        }
    }

    /// Whether a vCPU of this guest has been granted a processor as a new activation and not
    /// started it yet (pending events will go out with its NEWPROC).
    pub fn starting_activation(&self) -> bool {
        self.procs
            .alloc
            .view(self.id)
            .vcpus
            .contains(&Slot::GrantedNew)
    }

    /// Pending events go now, with the upcall interrupt, to a running vCPU the guest does not
    /// mark idle (`SharedHeader::idle_vcpus`). If every running vCPU idles they stay pending
    /// (they go out with the next delivered event, new activation or quantum retry): an idle
    /// vCPU has nothing to do with them, and waking it from a halt costs ~40 us.
    pub fn flush_to_busy(&self) {
        let idle = self.shared().idle_vcpus();
        let view = self.procs.alloc.view(self.id);
        let busy = view
            .vcpus
            .iter()
            .enumerate()
            .find(|&(i, s)| matches!(s, Slot::Running(_)) && (i >= 64 || idle & (1 << i) == 0));
        if let Some((vcpu, _)) = busy {
            self.flush_pending(vcpu as u32);
        }
    }

    /// The upcall watchdog (called with every retry): a running vCPU whose queue has kept
    /// records untaken for [`UPCALL_WATCH_BOUND`] gets the upcall interrupt again and is
    /// kicked, and on its way out checks that no requested interrupt was left undelivered (kvm_pvm was seen to leave the upcall vector
    /// requested for good on a vCPU with interrupts on; docs/activations.md). Once per bound
    /// while it lasts; a kick that finds nothing wrong costs one exit.
    pub fn watch_upcall_queues(&self) {
        let view = self.procs.alloc.view(self.id);
        for (vcpu, slot) in view.vcpus.iter().enumerate() {
            if !matches!(slot, Slot::Running(_)) {
                continue;
            }
            if self
                .acts
                .untaken_for(self.shared(), vcpu as u32, UPCALL_WATCH_BOUND)
            {
                self.stats
                    .upcall_watch_kicks
                    .fetch_add(1, Ordering::Relaxed);
                self.vcpus[vcpu].request_redelivery();
                // The records' interrupt may have been spent by a drain that ended early (the
                // guest's own bug, or a hostile guest's choice): raise it again. A guest that
                // has the vector requested already or in service takes it once more at most.
                self.stats
                    .upcall_interrupts_resent
                    .fetch_add(1, Ordering::Relaxed);
                self.send_upcall_interrupt(vcpu as u32);
            }
        }
    }

    /// Called every quantum: retry events that found no room, and stop a guest whose queues
    /// have had no room for a second (it does not consume its upcalls, or corrupted them).
    pub fn retry_pending(&self) {
        if self.acts.enabled() && self.outcome().is_none() {
            self.watch_upcall_queues();
        }
        if !self.acts.enabled() || self.acts.pending() == 0 || self.outcome().is_some() {
            return;
        }
        match self.running_vcpu(None) {
            Some(vcpu) => self.flush_pending(vcpu),
            None => self.procs.revoke(self.procs.alloc.want_one(self.id)),
        }
        // (The flush may have emptied the queue of pending events: then nothing is stalled.)
        if let Some(stalled) = self.acts.stalled_for().filter(|_| self.acts.pending() > 0) {
            if stalled > UPCALL_STALL_LIMIT {
                // Where was each vCPU? The hang report says (`hang/`).
                self.begin_hang_report("upcall queues without room");
                self.finish(Outcome::fault(
                    self.running_vcpu(None).unwrap_or(0),
                    format!(
                        "the guest does not consume its upcalls, or corrupted its queue indices: \
                         no room in its queues for {stalled:?} ({} events pending)\n  {}\n  \
                         allocator: {}",
                        self.acts.pending(),
                        self.acts.describe(self.shared()),
                        self.describe_vcpus()
                    ),
                ));
            }
        }
    }
}
