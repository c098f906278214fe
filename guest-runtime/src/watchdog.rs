//! The watchdog (tests): if the guest still runs when it is due, the next timer interrupt (or
//! scheduler loop, or lock wait) on any vCPU prints where that vCPU was and the runtime's state,
//! then ends the guest with status 99. It works even when the scheduler no longer handles
//! upcalls.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use activm_stub::println;

use crate::arch::cpu;
use crate::percpu;

/// TSC after which the watchdog fires (0: off).
static DUE: AtomicU64 = AtomicU64::new(0);
/// TSC at which the watchdog fired (0: it has not).
static FIRED: AtomicU64 = AtomicU64::new(0);
/// How long the report may take before any vCPU ends the guest without it (ns). The context
/// that prints the report can be dropped by the VMM's taking the vCPU: a timer interrupt on
/// top of a new activation's first instruction, or an idle scheduler's loop, is discarded
/// whole (`upcall/recover.rs`), and its `exit` with it.
const REPORT_GRACE_NS: u64 = 5_000_000_000;
/// What prints the runtime's state when it fires (`stats::dump`, installed at start-up).
static REPORT: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
/// What arms this vCPU's timer to interrupt by a TSC deadline (`alarm::arm_by`, installed at
/// start-up): the vCPU running the report takes a timer interrupt after the grace, nested in
/// the report if it never returns, even where nothing else would arm its timer.
static ARM: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Arms (or with `None` disarms) the watchdog, `after` from now.
pub fn set_watchdog(after: Option<core::time::Duration>) {
    let at = after.map_or(0, |d| {
        cpu::rdtsc() + percpu::ns_to_ticks(d.as_nanos() as u64)
    });
    DUE.store(at, Ordering::Release);
}

/// Installs what prints the runtime's state when the watchdog fires (`stats::dump` at
/// start-up; tests may put another one there).
pub fn set_report(report: fn()) {
    REPORT.store(report as *mut (), Ordering::Release);
}

/// Installs what arms this vCPU's timer by a TSC deadline.
pub(crate) fn set_arm(arm: fn(u64)) {
    ARM.store(arm as *mut (), Ordering::Release);
}

/// Arms this vCPU's timer for the end of the report's grace, if the arming hook is installed.
fn arm_for_grace(fired: u64) {
    let arm = ARM.load(Ordering::Acquire);
    if !arm.is_null() {
        // SAFETY: only `set_arm` stores non-null values, all `fn(u64)`.
        let arm = unsafe { core::mem::transmute::<*mut (), fn(u64)>(arm) };
        arm(fired + percpu::ns_to_ticks(REPORT_GRACE_NS) + percpu::ns_to_ticks(1_000_000));
    }
}

/// The check without an interrupted context (lock waits, scheduler loops).
pub(crate) fn tick() {
    check(0);
}

/// Timer interrupt at `pc` (or [`tick`]): fires the watchdog if it is due.
pub(crate) fn check(pc: u64) {
    let fired = FIRED.load(Ordering::Relaxed);
    if fired != 0 {
        if cpu::rdtsc().saturating_sub(fired) > percpu::ns_to_ticks(REPORT_GRACE_NS) {
            println!("activm-rt: watchdog: its report did not end the guest within 5 s; ending it");
            activm_stub::exit(99);
        }
        // Whatever else this vCPU does meanwhile, it looks again after the grace.
        arm_for_grace(fired);
        return;
    }
    let at = DUE.load(Ordering::Relaxed);
    if at == 0 || cpu::rdtsc() < at || DUE.swap(0, Ordering::AcqRel) == 0 {
        return;
    }
    let fired = cpu::rdtsc().max(1);
    FIRED.store(fired, Ordering::Relaxed);
    // The report may never return (its context dropped, or stuck): this vCPU's own timer ends
    // the guest after the grace (the other vCPUs may run threads with no timer armed).
    arm_for_grace(fired);
    if pc == 0 {
        // From `tick`: a lock waiter (`SpinLock::lock`) or a scheduler loop.
        println!(
            "activm-rt: watchdog: vCPU {} in a lock wait or scheduler loop (no interrupt)",
            activm_stub::vcpu_id()
        );
    } else {
        println!(
            "activm-rt: watchdog: vCPU {} interrupted at pc {pc:#x}",
            activm_stub::vcpu_id()
        );
    }
    let report = REPORT.load(Ordering::Acquire);
    if !report.is_null() {
        // SAFETY: only `set_report` stores non-null values, all `fn()`.
        let report = unsafe { core::mem::transmute::<*mut (), fn()>(report) };
        report();
    }
    activm_stub::exit(99);
}
