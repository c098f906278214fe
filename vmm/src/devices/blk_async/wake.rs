//! Telling a guest that completions wait in its ring: an interrupt to an idle vCPU, to a
//! running one when it asked for a nudge, or a processor for a guest that holds none.

use std::mem::offset_of;
use std::sync::atomic::Ordering;

use protocol::shared::SharedHeader;

use crate::allocator::Slot;
use crate::guest::Guest;
use crate::vm::Outcome;

/// Interrupt one running vCPU (the guest asked for it with `nudge_us`; socket reports a busy
/// guest left untaken): whether one holds a processor.
pub(crate) fn wake_one_running(guest: &Guest) -> bool {
    let view = guest.procs.alloc.view(guest.id);
    let running = (0..guest.config.vcpus)
        .find(|&v| matches!(view.vcpus.get(v as usize), Some(Slot::Running(_))));
    let Some(target) = running else {
        return false;
    };
    if let Err(e) = crate::arch::current::send_wakeup_interrupt(&guest.vm, target) {
        guest.finish(Outcome::fault(
            target,
            format!("cannot send the I/O completion interrupt: {e}"),
        ));
    }
    true
}

/// Completions were posted: interrupt an idle vCPU of the guest if one is idle; if the guest
/// gave every processor back (`SHARED_FEATURE_YIELD_IO`), it wants one again. Busy vCPUs find
/// the completions when they schedule.
pub(super) fn wake_for_completions(guest: &Guest) {
    if !wake_one_idle(guest) {
        want_processor_if_none_held(guest);
    }
}

/// Work waits in a ring for a guest (`SHARED_FEATURE_YIELD_IO`, `SHARED_FEATURE_YIELD_NET`):
/// if it gave every processor back, it wants one again (a new activation takes the work);
/// whether it did.
pub(crate) fn want_processor_if_none_held(guest: &Guest) -> bool {
    if !guest.acts.enabled() {
        return false;
    }
    let view = guest.procs.alloc.view(guest.id);
    if view.vcpus.iter().any(|s| s.holds_processor()) {
        return false;
    }
    guest.procs.revoke(guest.procs.alloc.want_one(guest.id));
    true
}

/// Interrupt one vCPU the guest marks idle, preferring one that holds a processor (whether
/// there was one). (The guest sets its idle bit, then looks at the ring; the caller published,
/// fenced, then calls this.) The interrupted vCPU's bit is cleared here, atomically: until the
/// guest sets it again (its next halt), later reports find a wake-up on its way and send no
/// second interrupt (each costs the vCPU an emulated interrupt entry; the net thread, posting
/// requests one by one while the vCPU woke, sent several per wake-up).
pub(crate) fn wake_one_idle(guest: &Guest) -> bool {
    let Ok(word) = guest
        .ram
        .atomic_u64(guest.plan.shared_area.start + offset_of!(SharedHeader, idle_vcpus) as u64)
    else {
        return false;
    };
    let mut idle = word.load(Ordering::SeqCst) & vcpu_mask(guest);
    if idle == 0 {
        return false;
    }
    let view = guest.procs.alloc.view(guest.id);
    while idle != 0 {
        let running = (0..guest.config.vcpus).find(|&v| {
            idle & (1 << v) != 0 && matches!(view.vcpus.get(v as usize), Some(Slot::Running(_)))
        });
        let target = running.unwrap_or(idle.trailing_zeros());
        let bit = 1u64 << target;
        if word.fetch_and(!bit, Ordering::SeqCst) & bit == 0 {
            // Woken meanwhile (by the guest or another VMM thread): it finds the reports.
            idle &= !bit;
            continue;
        }
        if let Err(e) = crate::arch::current::send_wakeup_interrupt(&guest.vm, target) {
            guest.finish(Outcome::fault(
                target,
                format!("cannot send the I/O completion interrupt: {e}"),
            ));
        }
        break;
    }
    true
}

/// The guest's vCPUs as a mask of `SharedHeader::idle_vcpus` bits.
fn vcpu_mask(guest: &Guest) -> u64 {
    if guest.config.vcpus >= 64 {
        u64::MAX
    } else {
        (1u64 << guest.config.vcpus) - 1
    }
}
