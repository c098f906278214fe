//! The vCPU's half of the upcall watchdog (`Guest::watch_upcall_queues`): a running vCPU whose
//! queue keeps records untaken is kicked, and looks at its interrupt controller here.
//!
//! kvm_pvm (the host KVM these machines have) can leave a requested interrupt undelivered on a
//! vCPU that has interrupts on: the vector stays in the local APIC's IRR while the guest runs
//! on at CPL3, and exits and re-entries do not deliver it; only something that makes KVM
//! re-evaluate its pending events does (an EOI, a register write, `KVM_SET_MP_STATE`). With
//! host-CPU placement that left the guest without its upcalls until the VMM stopped it
//! (docs/activations.md, "Placing granted vCPUs on host CPUs").
//!
//! A deliverable vector seen once proves nothing: an interrupt sent while the vCPU's thread
//! waited for a host CPU is delivered at the next entry. Seen again at the next look, after
//! the guest has moved on (it ran, so KVM entered it and did not deliver), it is stuck: the
//! vCPU makes KVM look again, and the guest's `--stats` count it. Likewise a vCPU that KVM
//! still holds halted at the next look, its records untaken: it is woken (a stalled soak run
//! had a running vCPU sit at its new activation's first instruction for a second, nothing
//! requested).

use std::sync::atomic::Ordering;

use super::VcpuThread;
use crate::arch::current as arch;

impl VcpuThread {
    /// Kicked by the watchdog: redeliver a requested interrupt KVM left undelivered, or wake a
    /// vCPU KVM keeps halted with records waiting (see the module comment).
    pub(super) fn redeliver_stuck_interrupt(&mut self) {
        let look = arch::halted(&self.fd).and_then(|halted| {
            arch::undelivered_interrupt(&self.fd).map(|undelivered| (halted, undelivered))
        });
        let (halted, undelivered) = match look {
            Ok(look) => look,
            Err(e) => {
                eprintln!(
                    "activm: vCPU {}: cannot read its interrupt state: {e}",
                    self.index
                );
                return;
            }
        };
        if !halted && !undelivered {
            self.undelivered_at = None;
            return;
        }
        let here = arch::progress_mark(&self.fd);
        let Some(before) = self.undelivered_at.replace(here) else {
            return;
        };
        if !halted && before == here {
            return;
        }
        self.undelivered_at = None;
        // KVM re-evaluates pending events after `KVM_SET_MP_STATE`. Runnable is the state a
        // running vCPU is in, and the one its records (which came with an interrupt) owe a
        // halted one.
        if let Err(e) = arch::make_runnable(&self.fd) {
            eprintln!(
                "activm: vCPU {}: cannot redeliver its interrupt: {e}",
                self.index
            );
            return;
        }
        let count = if halted {
            &self.guest.stats.halted_woken
        } else {
            &self.guest.stats.interrupts_redelivered
        };
        count.fetch_add(1, Ordering::Relaxed);
    }
}
