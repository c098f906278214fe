//! What a vCPU does when it loses its processor: an oblivious vCPU just waits to resume; a vCPU
//! of a guest that takes upcalls cancels an activation that never ran, or grants a deferral
//! the guest asked for, runs forward to user level, and hands its context over (PREEMPTED).
//! Also the two other ways a processor goes back: a device request that blocks (BLOCKED, then
//! UNBLOCKED) and the guest's own `sa_yield`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::shared::{UpcallKind, VcpuRunState};

use super::{ExitAction, VcpuThread, DEFER_GRACE_US, MAX_RUN_FORWARD, RUN_FORWARD_US};
use crate::activation::Event;
use crate::allocator::Release;
use crate::arch::current::{self as arch, abi::UserContext};
use crate::devices::blk::Pending;
use crate::devices::fs::GuestMem;
use crate::devices::Blocking;
use crate::vm::Outcome;

impl VcpuThread {
    /// The allocator took the processor, or the vCPU reached a `--preempt-at` point: hand the
    /// context to the guest or just wait.
    pub(super) fn give_back_processor(&mut self) {
        // At a point: taken exactly there, so no deferral.
        let at_point = std::mem::take(&mut self.preempt_here);
        self.give_back(at_point);
        // A point reached meanwhile (running forward, in a deferral) was handed over there.
        self.preempt_here = false;
    }

    fn give_back(&mut self, at_point: bool) {
        let kicked_at = arch::timestamp();
        self.complete_pending_io();
        if !self.guest.acts.enabled() {
            return self.deschedule();
        }
        if self.cancel_fresh_activation() {
            return;
        }
        if !at_point
            && self.guest.shared().defer_requested(self.index)
            && self.timer.is_some()
            && self.defer_preemption()
        {
            return;
        }
        if self.run_forward_to_user() {
            self.hand_over_preempted(kicked_at);
        }
    }

    /// Taken away without a hand-off: the vCPU resumes where it was when it runs again.
    fn deschedule(&mut self) {
        self.guest.stats.deschedules.fetch_add(1, Ordering::Relaxed);
        self.release(Release::Descheduled);
    }

    /// Revoked before the new activation ran a single instruction: there is no context to
    /// hand over, and its NEWPROC must not reach another vCPU. Cancel it; `true` if it did.
    fn cancel_fresh_activation(&mut self) -> bool {
        let Some(fresh) = self.fresh.take() else {
            return false;
        };
        if !arch::at_activation_entry(&self.fd, fresh.entry, fresh.stack_top) {
            return false;
        }
        self.guest
            .acts
            .cancel_activation(self.guest.shared(), self.index, fresh);
        self.guest.stats.canceled.fetch_add(1, Ordering::Relaxed);
        self.release(Release::Preempted);
        true
    }

    /// The guest asked for a short reprieve (it holds a lock): grant it once, bounded, and tell
    /// it to yield when it can (`preempt_pending`). `true` if the processor went back meanwhile
    /// some other way (the guest ended, blocked or yielded).
    fn defer_preemption(&mut self) -> bool {
        let guest = Arc::clone(&self.guest);
        let area = guest.shared();
        area.set_preempt_pending(self.index, true);
        self.guest.stats.deferrals.fetch_add(1, Ordering::Relaxed);
        if let Some(timer) = &self.timer {
            timer.arm(DEFER_GRACE_US);
        }
        let action = loop {
            match self.step() {
                ExitAction::Continue => {}
                other => break other,
            }
        };
        if let ExitAction::Kicked = action {
            // The grace is over.
            self.complete_pending_io();
            area.set_preempt_pending(self.index, false);
            return false;
        }
        if !matches!(action, ExitAction::Finish(_)) {
            area.set_preempt_pending(self.index, false);
        }
        self.ends_handoff(action)
    }

    /// Run the vCPU forward until it is at CPL3 with interrupts on, where its context can be
    /// handed over. `false` if it could not be caught there (it is descheduled) or the
    /// processor went back some other way meanwhile.
    fn run_forward_to_user(&mut self) -> bool {
        let mut forward = 0;
        while !arch::at_user_level(&self.fd) {
            if forward == 0 {
                self.guest
                    .stats
                    .run_forwards
                    .fetch_add(1, Ordering::Relaxed);
            }
            forward += 1;
            if forward > MAX_RUN_FORWARD || self.timer.is_none() {
                self.deschedule();
                return false;
            }
            if let Some(timer) = &self.timer {
                timer.arm(RUN_FORWARD_US);
            }
            let action = self.step();
            if self.ends_handoff(action) {
                return false;
            }
            self.complete_pending_io();
        }
        true
    }

    /// Act on an exit seen while the processor is being taken: the guest ending, or the vCPU
    /// blocking or yielding (that frees the processor too: nothing to hand over). `true` if it
    /// was one of those.
    fn ends_handoff(&mut self, action: ExitAction) -> bool {
        match action {
            ExitAction::Continue | ExitAction::Kicked => false,
            ExitAction::Finish(outcome) => {
                self.guest.finish(outcome);
                true
            }
            ExitAction::Block(pending) => {
                // The processor is being taken: no new activation here.
                self.block_on_request(pending, false);
                true
            }
            ExitAction::Stop => {
                self.yielded(0);
                true
            }
            ExitAction::Yield { wake_ns } => {
                self.yielded(wake_ns);
                true
            }
        }
    }

    /// Take the context at user level, end the activation and send the PREEMPTED record to a
    /// vCPU that keeps running.
    fn hand_over_preempted(&mut self, kicked_at: u64) {
        let Some(context) = self.take_context("preempted") else {
            return;
        };
        let activation = self.guest.acts.current(self.index);
        self.guest
            .acts
            .end_activation(self.guest.shared(), self.index, VcpuRunState::Preempted);
        let mut event = Event::new(UpcallKind::Preempted, activation, self.index, 0);
        event.context = Some(Box::new(context));
        event.tsc = kicked_at;
        self.guest.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.guest
            .stats
            .preempt_delays
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(arch::timestamp().saturating_sub(kicked_at));
        // Before the record goes out (its thread must not be seen resumed first); after the
        // latency sample, which tracing must not change.
        self.guest
            .timeline_handed_over(self.index, UpcallKind::Preempted, kicked_at);
        // Give the processor back first, so the record goes to a vCPU that keeps running.
        self.release(Release::Preempted);
        self.guest.deliver(event);
    }

    /// A device request must wait (longer than the disk's inline wait, which the exit already
    /// decided against): give the processor back, finish the request on this thread, then
    /// hand the context over (UNBLOCKED) or wait to resume where the vCPU was.
    ///
    /// With activations (and the request made at CPL3, as the runtime does): the activation
    /// ends, the processor goes to a new activation if the guest has a parked vCPU and wants it,
    /// and a BLOCKED record names the ended activation. When the request completes its result is
    /// put in the thread's result register and that context travels in an UNBLOCKED record,
    /// while this vCPU parks; if the guest is owed a processor, this vCPU starts that new
    /// activation itself with the UNBLOCKED in its own queue. Otherwise the UNBLOCKED goes to a
    /// running vCPU (into the queue that got the BLOCKED, if it still lives, so it cannot
    /// overtake it). Oblivious guests' vCPUs just lose their processor meanwhile.
    ///
    /// A request left with only the device's latency (its data moved in the exit) takes the
    /// short way when `may_reenter`: [`VcpuThread::reenter_while_blocked`]. Returns whether
    /// this vCPU runs a new activation now (the run loop goes on running it).
    pub(super) fn block_on_request(&mut self, blocking: Blocking, may_reenter: bool) -> bool {
        let handing_over = self.guest.acts.enabled() && arch::at_user_level(&self.fd);
        if let (true, true, Blocking::Disk(Pending::Latency { result, due })) =
            (handing_over, may_reenter, &blocking)
        {
            return self.reenter_while_blocked(*result, *due);
        }
        self.trace_state("blocked", true);
        let activation = self.guest.acts.current(self.index);
        if handing_over {
            self.guest
                .timeline_handed_over(self.index, UpcallKind::Blocked, arch::timestamp());
            self.fresh = None;
            self.guest
                .acts
                .end_activation(self.guest.shared(), self.index, VcpuRunState::Blocked);
        }
        self.release(Release::Blocked);
        if handing_over {
            // No interrupt for it: it goes out with the NEWPROC of the activation that takes
            // the processor, or ahead of the UNBLOCKED, or with the next quantum's retry.
            self.guest
                .post_pending(Event::new(UpcallKind::Blocked, activation, self.index, 0));
        }
        let result = match &blocking {
            Blocking::Disk(pending) => match &self.guest.disk {
                Some(disk) => disk.finish(&self.guest.ram, pending, &self.control.stop_requested),
                None => unreachable!("a disk request without a disk"),
            },
            Blocking::File(slow) => {
                self.guest
                    .stats
                    .file_calls_blocked
                    .fetch_add(1, Ordering::Relaxed);
                slow.perform(&GuestMem {
                    ram: &self.guest.ram,
                    plan: &self.guest.plan,
                }) as u64
            }
        };
        self.trace_state("blocked", false);
        arch::set_hypercall_result(&mut self.fd, result);
        if self.control.stop_requested.load(Ordering::Acquire) {
            return false;
        }
        if !handing_over {
            let procs = &self.guest.procs;
            let (kicks, _) = procs
                .alloc
                .unblock(self.guest.id, self.index as usize, false);
            procs.revoke(kicks);
            return false;
        }
        self.complete_pending_io();
        let Some(context) = self.take_context("unblocked") else {
            return false;
        };
        let mut event = Event::new(UpcallKind::Unblocked, activation, self.index, result);
        event.context = Some(Box::new(context));
        let procs = &self.guest.procs;
        let (kicks, restarts_here) = procs
            .alloc
            .unblock(self.guest.id, self.index as usize, true);
        procs.revoke(kicks);
        if restarts_here {
            // This vCPU starts the new activation the guest is owed next (the run loop picks
            // up the grant): the record rides in its own queue, after its NEWPROC, and no
            // other vCPU has to be interrupted.
            self.guest.post_pending(event);
        } else {
            self.guest.deliver(event);
        }
        false
    }

    /// Blocking on a request whose data moved in the exit: only the device's latency is left
    /// and the result is known, so the thread's context is final now. Take it (result in
    /// place), end the activation and start a new one right here, on this processor, with the
    /// BLOCKED record after its NEWPROC (Anderson et al. 1992, 3.1: the kernel upcalls on the
    /// processor the blocked activation ran on). The disk's timer thread delivers the UNBLOCKED
    /// at the due time. Against the hand-off (release the processor, wake another vCPU's
    /// thread for the new activation, then at completion wake this one to take the context
    /// and park again) no host thread changes hands. Returns whether the new activation runs.
    fn reenter_while_blocked(&mut self, result: u64, due: std::time::Instant) -> bool {
        arch::set_hypercall_result(&mut self.fd, result);
        self.complete_pending_io();
        let Some(context) = self.take_context("unblocked") else {
            return false;
        };
        let activation = self.guest.acts.current(self.index);
        self.guest
            .timeline_handed_over(self.index, UpcallKind::Blocked, arch::timestamp());
        if let Some(trace) = &self.guest.trace {
            trace.instant(self.guest.id, self.index, "blocked: new activation here", 0);
        }
        self.fresh = None;
        self.guest
            .acts
            .end_activation(self.guest.shared(), self.index, VcpuRunState::Blocked);
        self.guest
            .post_pending(Event::new(UpcallKind::Blocked, activation, self.index, 0));
        self.guest
            .stats
            .blocked_reentered
            .fetch_add(1, Ordering::Relaxed);
        let started = match self.start_activation() {
            Ok(true) => true,
            Ok(false) => {
                // Revoked while it waited for an upcall stack: the BLOCKED stays pending.
                self.release(Release::Preempted);
                false
            }
            Err(outcome) => {
                self.guest.finish(outcome);
                false
            }
        };
        let mut event = Event::new(UpcallKind::Unblocked, activation, self.index, result);
        event.context = Some(Box::new(context));
        if let Some(disk) = &self.guest.disk {
            disk.count_blocked_until(due);
            disk.queue.unblock_at(&self.guest, due, event);
        }
        started
    }

    /// The vCPU's user context (sync regs and one FPU transfer), to hand to the guest; if KVM
    /// refuses it the guest is stopped and `None` returned.
    fn take_context(&self, what: &str) -> Option<UserContext> {
        match arch::take_user_context(&self.fd) {
            Ok(context) => Some(context),
            Err(e) => {
                self.guest.finish(Outcome::fault(
                    self.index,
                    format!("cannot take the {what} context: {e}"),
                ));
                None
            }
        }
    }

    /// The guest gave the processor up itself (`sa_yield`), possibly while the VMM was taking
    /// it: nothing to hand over; the vCPU parks until a new activation, or until `wake_ns`
    /// from now (if not 0) when it makes the guest want a processor again.
    pub(super) fn yielded(&mut self, wake_ns: u64) {
        self.guest.stats.yields.fetch_add(1, Ordering::Relaxed);
        self.wake_at = (wake_ns != 0)
            .then(|| std::time::Instant::now() + std::time::Duration::from_nanos(wake_ns));
        // Given back with block requests in flight (`SHARED_FEATURE_YIELD_IO`): back when the
        // earliest completion is due, if sooner, unless another vCPU of the guest holds a
        // processor (the completion interrupts it, or it finds it when it schedules).
        let mut for_sleeper = self.wake_at.is_some();
        if let Some(due) = self
            .guest
            .disk
            .as_ref()
            .and_then(|d| d.queue.earliest_due())
            .filter(|_| {
                !self
                    .guest
                    .procs
                    .alloc
                    .others_hold(self.guest.id, self.index as usize)
            })
        {
            for_sleeper = false;
            self.wake_at = Some(self.wake_at.map_or(due, |at| at.min(due)));
        }
        self.complete_pending_io();
        self.fresh = None;
        self.guest
            .acts
            .yield_activation(self.guest.shared(), self.index);
        // Released and the wake-up recorded in one step: the thread may lose its host CPU to
        // the vCPU it grants the processor to (`Allocator::yield_processor`).
        let procs = &self.guest.procs;
        let (kicks, carriers) = procs.alloc.yield_processor(
            self.guest.id,
            self.index as usize,
            self.wake_at.as_mut(),
            for_sleeper,
        );
        procs.revoke(kicks);
        if let Some((carriers, first)) = carriers {
            for carrier in carriers {
                procs.kick_at(carrier, first);
            }
        }
        // A completion posted while the guest was deciding to yield found this vCPU still
        // running and interrupted nobody: if the guest holds no processor now, it wants one.
        // (The poster publishes, then looks at the allocator; this side releases, then looks at
        // the ring: under the two locks one of them sees the other.)
        if let Some(disk) = &self.guest.disk {
            let view = self.guest.procs.alloc.view(self.guest.id);
            if !view.vcpus.iter().any(|s| s.holds_processor()) && disk.queue.unconsumed(&self.guest)
            {
                let procs = &self.guest.procs;
                procs.revoke(procs.alloc.want_one(self.guest.id));
            }
        }
        // Records that reached its queue after the guest decided to yield were taken back:
        // they go to a running vCPU, or make the guest want a processor to receive them.
        if self.guest.acts.pending() > 0 {
            match self.guest.running_vcpu(None) {
                Some(vcpu) => self.guest.flush_pending(vcpu),
                None => {
                    let procs = &self.guest.procs;
                    procs.revoke(procs.alloc.want_one(self.guest.id));
                }
            }
        }
    }
}
