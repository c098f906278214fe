//! The vCPU's half of the upcall watchdog (`Guest::watch_upcall_queues`): a running vCPU whose
//! queue keeps records untaken is kicked, and looks at its interrupt controller here.
//!
//! What it looks for, and what was found (docs/activations.md, "The upcall watchdog"): an upcall
//! vector requested and deliverable (IRR set, interrupts on) that KVM does not inject while the
//! guest runs. None was found on kvm_pvm once the looks were made exact: a vector requested at
//! one exit is, in every case measured, an interrupt sent while the vCPU's thread waited for a
//! host CPU or while it was out of the guest for the kick itself, and the next entry delivers
//! it. So a requested upcall vector counts as undelivered only if it is still requested at two
//! more looks, each after the vCPU has run on for [`RELOOK`] (its thread on a CPU for at least
//! [`RAN_ENOUGH`] meanwhile) with no upcall interrupt sent to it in between; then the vCPU
//! makes KVM look at its pending events again (`KVM_SET_MP_STATE`) and `--stats` counts it.
//!
//! Likewise a vCPU that KVM still holds halted at the next watchdog look, its records untaken,
//! is woken (a stalled soak run had a running vCPU sit at its new activation's first
//! instruction for a second, nothing requested, before the watchdog existed).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::VcpuThread;
use crate::arch::current as arch;

/// How long the vCPU runs on before the second look at a requested upcall vector.
pub(super) const RELOOK: Duration = Duration::from_micros(300);
/// How much CPU time its thread must have had by the second look for the look to count.
const RAN_ENOUGH: Duration = Duration::from_micros(100);
/// A look not taken by then is given up (the host is that busy, or the vCPU was descheduled).
const RELOOK_GIVE_UP: Duration = Duration::from_millis(50);

/// A requested upcall vector seen at a look, waiting for the next.
#[derive(Clone, Copy, Debug)]
pub(super) struct Relook {
    /// When the second look is due.
    pub(super) due: Instant,
    /// When the first look was.
    since: Instant,
    /// The thread's CPU time at the first look.
    cpu: Duration,
    /// Upcall interrupts sent to the vCPU before the first look.
    sent: u64,
    /// This is the third look: the vector was still requested at the second.
    again: bool,
}

impl VcpuThread {
    /// Kicked by the watchdog: wake a vCPU KVM keeps halted with records waiting, or take a
    /// first look at a requested upcall vector (see the module comment).
    pub(super) fn redeliver_stuck_interrupt(&mut self) {
        let look = arch::halted(&self.fd).and_then(|halted| {
            arch::undelivered_interrupt(&self.fd, arch::Vectors::Upcall)
                .map(|requested| (halted, requested))
        });
        let (halted, requested) = match look {
            Ok(look) => look,
            Err(e) => {
                eprintln!(
                    "activm: vCPU {}: cannot read its interrupt state: {e}",
                    self.index
                );
                return;
            }
        };
        if requested && self.relook.is_none() {
            let now = Instant::now();
            self.relook = Some(Relook {
                due: now + RELOOK,
                since: now,
                cpu: self.control.thread_cpu_time().unwrap_or_default(),
                sent: self.control.upcall_interrupts.load(Ordering::Relaxed),
                again: false,
            });
        }
        // Halted at two watchdog looks in a row, its records untaken: wake it.
        let halted_before = std::mem::replace(&mut self.halted_seen, halted);
        if !halted || !halted_before {
            return;
        }
        self.halted_seen = false;
        if self.make_runnable() {
            self.guest
                .stats
                .halted_woken
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Out of `KVM_RUN` with a look pending: redeliver an upcall vector still requested after
    /// the vCPU ran on twice, if no upcall interrupt was sent to it meanwhile.
    pub(super) fn relook_at_upcall(&mut self) {
        let Some(relook) = self.relook else { return };
        let ran = self
            .control
            .thread_cpu_time()
            .unwrap_or_default()
            .saturating_sub(relook.cpu);
        if relook.since.elapsed() >= RELOOK_GIVE_UP {
            // Its thread waited that long for a host CPU, or the vCPU gave its processor back
            // meanwhile: nothing can be told.
            self.relook = None;
            return;
        }
        if ran < RAN_ENOUGH {
            // Kicked early, or its thread waited for a host CPU: look again once it ran.
            self.relook = Some(Relook {
                due: Instant::now() + RELOOK,
                ..relook
            });
            return;
        }
        self.relook = None;
        let sent = self.control.upcall_interrupts.load(Ordering::Relaxed);
        if sent != relook.sent
            || !arch::undelivered_interrupt(&self.fd, arch::Vectors::Upcall).unwrap_or(false)
        {
            return;
        }
        if !relook.again {
            // Once more: an interrupt that came just before this exit (the kick's own) would
            // be delivered by the next entry.
            let now = Instant::now();
            self.relook = Some(Relook {
                due: now + RELOOK,
                since: now,
                cpu: self.control.thread_cpu_time().unwrap_or_default(),
                sent,
                again: true,
            });
            return;
        }
        if self.make_runnable() {
            self.guest
                .stats
                .interrupts_redelivered
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// KVM re-evaluates pending events after `KVM_SET_MP_STATE`. Runnable is the state a
    /// running vCPU is in, and the one its records (which came with an interrupt) owe a halted
    /// one.
    fn make_runnable(&self) -> bool {
        match arch::make_runnable(&self.fd) {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "activm: vCPU {}: cannot redeliver its interrupt: {e}",
                    self.index
                );
                false
            }
        }
    }
}
