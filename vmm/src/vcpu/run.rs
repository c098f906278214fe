//! The run loop of a vCPU thread: wait for a processor, start a new activation or resume, run
//! guest code until the processor is revoked or the vCPU is done, and act on how it ended.

use std::sync::atomic::Ordering;

use protocol::shared::UpcallKind;

use super::exits::Exit;
use super::{ExitAction, VcpuThread, STACK_WAIT};
use crate::activation::StartError;
use crate::allocator::{Acquired, Release, TimerDue};
use crate::arch::current as arch;
use crate::kick::EXIT_KICK;
use crate::vm::Outcome;

impl VcpuThread {
    pub(super) fn trace_state(&self, name: &'static str, begin: bool) {
        if let Some(trace) = &self.guest.trace {
            if begin {
                trace.begin(self.guest.id, self.index, name);
            } else {
                trace.end(self.guest.id, self.index, name);
            }
        }
    }

    pub(super) fn release(&self, why: Release) {
        let procs = &self.guest.procs;
        procs.revoke(procs.alloc.release(self.guest.id, self.index as usize, why));
    }

    pub(super) fn run(&mut self) {
        // A request blocked and this vCPU went on as a new activation: run it, nothing to
        // acquire.
        let mut reentered = false;
        loop {
            if !std::mem::take(&mut reentered) && !self.acquire_and_start() {
                break;
            }
            self.place = crate::hang::state::RUNNING;
            self.trace_state("running", true);
            let step = self.run_until_revoked();
            self.trace_state("running", false);
            self.guest.drain_timeline();
            match step {
                ExitAction::Kicked => self.give_back_processor(),
                ExitAction::Yield { wake_ns } => self.yielded(wake_ns),
                ExitAction::Stop => {
                    self.release(Release::Stopped);
                    self.guest.vcpu_stopped();
                    break;
                }
                ExitAction::Finish(outcome) => {
                    self.guest.finish(outcome);
                    break;
                }
                ExitAction::Block(req) => {
                    self.place = "blocked on a device request";
                    reentered = self.block_on_request(req, true)
                }
                ExitAction::Continue => unreachable!("run_until_revoked returns only on a change"),
            }
        }
    }

    /// Wait for a processor and start a new activation or resume; `false` when the vCPU is
    /// done.
    fn acquire_and_start(&mut self) -> bool {
        loop {
            self.place = if self.wake_at.is_some() {
                "given back by the guest, waiting for its wake-up time"
            } else {
                "waiting for a processor"
            };
            let acquired = self.guest.procs.alloc.acquire_until(
                self.guest.id,
                self.index as usize,
                self.wake_at,
            );
            if acquired != Acquired::WakeDue {
                self.wake_at = None;
            }
            if matches!(acquired, Acquired::Resume | Acquired::NewActivation) {
                // This processor may be the one a latency-critical guest's timed wake-up
                // takes: carry it out on time (`Allocator::yield_until`).
                if let Some(at) = self.guest.procs.alloc.next_timed_wake(self.guest.id) {
                    self.control.kick_at(at);
                }
            }
            match acquired {
                Acquired::Exit => return false,
                Acquired::WakeDue => {
                    // The guest's timer is due and it gave this processor back for it: it
                    // wants one again (taken from another guest if need be), unless another
                    // vCPU of the guest covers its sleepers (`Allocator::timer_due`).
                    let procs = &self.guest.procs;
                    self.wake_at = None;
                    match procs.alloc.timer_due(self.guest.id, self.index as usize) {
                        TimerDue::Woken(kicks) => {
                            self.guest.stats.yield_wakes.fetch_add(1, Ordering::Relaxed);
                            procs.revoke(kicks);
                        }
                        TimerDue::Later(at) => self.wake_at = Some(at),
                        TimerDue::Gone => {}
                    }
                    continue;
                }
                Acquired::Resume => {
                    if self.guest.acts.enabled() {
                        self.guest.flush_pending(self.index);
                    }
                }
                Acquired::NewActivation => match self.start_activation() {
                    Ok(true) => {}
                    Ok(false) => {
                        // Revoked while it waited for an upcall stack: nothing started, nothing
                        // to hand over; the processor goes back at once.
                        self.release(Release::Preempted);
                        continue;
                    }
                    Err(outcome) => {
                        self.guest.finish(outcome);
                        return false;
                    }
                },
                Acquired::HandOff => {
                    // Waiting with a live context while the guest now takes upcalls: hand it
                    // over as if preempted now (running forward first if needed).
                    self.give_back_processor();
                    continue;
                }
            }
            return true;
        }
    }

    /// Whether a kick asked for this vCPU's processor and the allocator still wants it back
    /// (consumes the request).
    pub(super) fn take_revoke(&self) -> bool {
        self.control.take_revoke_request()
            && self
                .guest
                .procs
                .alloc
                .revoking(self.guest.id, self.index as usize)
    }

    /// Run guest code until the processor is revoked or the vCPU/guest is done.
    fn run_until_revoked(&mut self) -> ExitAction {
        loop {
            if self.control.stop_requested.load(Ordering::Acquire) {
                return ExitAction::Finish(self.guest.outcome().unwrap_or(Outcome::AllStopped));
            }
            if self.preempt_here || self.take_revoke() {
                return ExitAction::Kicked;
            }
            match self.step() {
                ExitAction::Continue | ExitAction::Kicked => {}
                other => return other,
            }
        }
    }

    /// One `KVM_RUN` and the handling of its exit.
    pub(super) fn step(&mut self) -> ExitAction {
        let exit = match self.fd.run() {
            Ok(exit) => {
                // It exited on an instruction, so it is not halted.
                self.control.maybe_halted.store(false, Ordering::Relaxed);
                Exit::copy(exit)
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.fd.set_kvm_immediate_exit(0);
                self.relook_at_upcall();
                if self.control.take_redelivery_request() {
                    self.redeliver_stuck_interrupt();
                }
                if self.control.take_interrupt_look_request() {
                    self.nudge_undelivered_interrupt();
                }
                if let Some(disk) = &self.guest.disk {
                    if let Err(why) = disk.queue.look_at_exit(&self.guest, false) {
                        return self.violation(why);
                    }
                }
                crate::devices::blk_async::after_kick(&self.guest, self.index, &self.fd);
                if let Some(hooks) = &self.guest.preempt_at {
                    hooks.rearm_due(&self.guest.ram);
                }
                // A yielded vCPU's wake-up time may be what kicked this thread.
                let procs = &self.guest.procs;
                procs.revoke(procs.alloc.fire_due_wakes());
                // Wake-ups still to come: this thread carries them if its processor is one
                // they may take.
                // (And the watchdog's second look at a requested upcall vector, `redeliver.rs`.)
                let relook = self.relook.map(|r| r.due);
                let next = procs.alloc.next_timed_wake(self.guest.id);
                if let Some(at) = next.into_iter().chain(relook).min() {
                    self.control.kick_at(at);
                }
                self.control.exits[EXIT_KICK].fetch_add(1, Ordering::Relaxed);
                return ExitAction::Kicked;
            }
            Err(e) => {
                return ExitAction::Finish(Outcome::fault(
                    self.index,
                    format!("KVM_RUN failed: {e}"),
                ))
            }
        };
        self.handle_exit(exit)
    }

    /// Let KVM finish an MMIO load the VMM answered (write the result register, advance the
    /// instruction pointer) without running guest code, so the registers are final.
    pub(super) fn complete_pending_io(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    /// Start a new activation here: NEWPROC (and pending events) in this vCPU's queue, then
    /// enter the guest's upcall entry on a stack from its pool.
    /// `Ok(false)`: the processor was revoked while the activation waited for a stack.
    pub(super) fn start_activation(&mut self) -> Result<bool, Outcome> {
        self.place = "starting a new activation";
        // An empty stack pool is a guest that has not recycled its upcall stacks yet: wait for
        // it (its other vCPUs run), up to a bound; a pool that stays empty is a guest bug.
        let waiting_since = std::time::Instant::now();
        let start = loop {
            match self.guest.acts.start_activation(self.guest.shared(), self.index) {
                Ok(start) => break start,
                Err(StartError::NoStack) if waiting_since.elapsed() < STACK_WAIT => {
                    if self.control.stop_requested.load(Ordering::Acquire) {
                        return Err(self.guest.outcome().unwrap_or(Outcome::AllStopped));
                    }
                    if self.take_revoke() {
                        return Ok(false);
                    }
                    self.guest.stats.stack_waits.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                Err(StartError::NoStack) => {
                    return Err(Outcome::fault(
                        self.index,
                        format!(
                            "a new activation has waited {STACK_WAIT:?} for an upcall stack: the guest's stack pool stays empty\n  {}",
                            self.guest.describe_upcalls()
                        ),
                    ))
                }
                Err(StartError::Fatal(why)) => return Err(Outcome::fault(self.index, why)),
            }
        };
        // A vCPU taken away while halted is still halted in KVM: the new activation would not
        // run until some interrupt came.
        if self.control.maybe_halted.swap(false, Ordering::Relaxed) {
            if let Err(e) = arch::make_runnable(&self.fd) {
                return Err(Outcome::fault(
                    self.index,
                    format!("KVM_SET_MP_STATE(RUNNABLE) for a new activation: {e}"),
                ));
            }
        }
        // Requests in the submission ring are taken, and block completions already due go into
        // the ring now: the activation sees them first.
        if let Some(disk) = &self.guest.disk {
            disk.queue
                .look_at_exit(&self.guest, true)
                .map_err(|why| Outcome::fault(self.index, why))?;
            disk.queue.post_due_now(&self.guest);
        }
        // A zero return address above the entry's stack frame.
        let _ = self.guest.ram.write_u64(start.stack_top - 8, 0);
        arch::enter_activation(
            &mut self.fd,
            start.entry,
            start.stack_top,
            self.index,
            start.activation,
        );
        self.fresh = Some(start);
        self.guest.stats.upcalls[UpcallKind::NewProc as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &self.guest.trace {
            trace.instant(
                self.guest.id,
                self.index,
                "upcall NEWPROC",
                start.activation as u64,
            );
        }
        Ok(true)
    }
}
