//! The interrupt watch, for every guest: every [`INTERRUPT_WATCH_PERIOD`] the dispatcher asks
//! each running vCPU whose timer the runtime's table (`protocol::diag`) shows overdue by more
//! than 10 ms, and every running vCPU of a guest without that table, to look at its interrupt
//! controller on its way out of `KVM_RUN` (`Guest::watch_interrupts`); a vCPU that has a
//! requested interrupt it could take now makes KVM look at its pending events again. A healthy
//! runtime guest (every benchmark's) is never kicked by it.
//!
//! kvm_pvm can leave a requested vector in the local APIC's IRR of a vCPU with interrupts on,
//! undelivered across exits and entries (`redeliver.rs`). The upcall watchdog rescues the upcall
//! vector of guests that take upcalls; the timer and reschedule vectors of every guest need
//! this. Seen under `--host-sched` (oblivious) with the host loaded (load average ~30 on 2
//! CPUs): the hang report showed four vCPUs running threads at CPL3 with interrupts on, the
//! timer vector 0x30 requested (IRR) and nothing in service, each vCPU's timer overdue by 0.4
//! to 5 s: no thread was ever preempted again, and spinning threads waited for queued ones
//! until `--timeout` (3 of 24 runs of `rt-tests` on 4 vCPUs).

use std::sync::atomic::Ordering;

use super::VcpuThread;
use crate::allocator::Slot;
use crate::arch::current as arch;
use crate::guest::Guest;
use crate::runtime_view::{self, TimerWord};

/// How often the dispatcher looks at the running vCPUs (a kick for each one that needs a look:
/// an exit and one `KVM_GET_LAPIC`, tens of microseconds).
pub const INTERRUPT_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

/// The interrupt watch looks at a runtime guest's vCPU whose timer is overdue by more than
/// this (ms): a timer interrupt is taken within microseconds of its deadline when the vCPU's
/// thread runs, and the watch looks every [`INTERRUPT_WATCH_PERIOD`] anyway.
const INTERRUPT_LATE_MS: u64 = 10;

impl VcpuThread {
    /// Kicked by the interrupt watch: a requested interrupt the vCPU could take now, still
    /// undelivered, makes KVM re-evaluate its pending events (`KVM_SET_MP_STATE` to runnable,
    /// the state of a running vCPU; it also wakes a halted one that KVM failed to wake).
    pub(super) fn nudge_undelivered_interrupt(&mut self) {
        match arch::undelivered_interrupt(&self.fd, arch::Vectors::Any) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                eprintln!(
                    "activm: vCPU {}: cannot read its interrupt state: {e}",
                    self.index
                );
                return;
            }
        }
        match arch::make_runnable(&self.fd) {
            Ok(()) => {
                self.guest
                    .stats
                    .interrupts_nudged
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => eprintln!(
                "activm: vCPU {}: cannot redeliver its interrupt: {e}",
                self.index
            ),
        }
    }
}

impl Guest {
    /// The interrupt watch, from the dispatcher: kick a running vCPU of the guest to look for
    /// a requested interrupt KVM left undelivered, when the runtime's table says its timer is
    /// overdue (or the guest publishes no table).
    pub fn watch_interrupts(&self) {
        if self.outcome().is_some() {
            return;
        }
        let view = self.procs.alloc.view(self.id);
        let table = self.shared().runtime_diag();
        let now = arch::timestamp();
        let late = self.tsc_khz.max(1) * INTERRUPT_LATE_MS;
        for (vcpu, slot) in view.vcpus.iter().enumerate() {
            if !matches!(slot, Slot::Running(_)) {
                continue;
            }
            // A guest whose runtime says when each vCPU's timer is due is looked at only when
            // one is overdue (so a healthy guest, as benchmarked, is never kicked); any other
            // guest at every period.
            let look = match runtime_view::timer_word(&self.ram, table, vcpu as u32) {
                TimerWord::Unknown => true,
                TimerWord::NotArmed => false,
                TimerWord::Armed(due) => now.saturating_sub(due) > late,
            };
            if look {
                self.vcpus[vcpu].request_interrupt_look();
            }
        }
    }
}
