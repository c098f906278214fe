//! CPU exceptions at CPL3. The stub delivers them to [`on_exception`] on the vCPU's alternate
//! stack (with CR2 read at CPL0). A page fault in the guard page of a thread stack ends the
//! guest with "thread 'name' overflowed its stack"; anything else returns, so the faulting
//! instruction runs again with exceptions fatal and the VMM reports it as before.

use core::fmt::Write;

use activm_stub::console::FixedBuf;
use activm_stub::{preempt, ExceptionFrame};

use crate::arch::cpu::{self, Word};
use crate::stack;
use crate::tcb;

/// #PF.
const PAGE_FAULT: u64 = 14;

pub fn on_exception(frame: &mut ExceptionFrame) {
    // Never released: this vCPU either ends the guest or re-faults fatally.
    preempt::hold();
    let guard = if frame.vector == PAGE_FAULT {
        stack::guard_owner(frame.cr2)
    } else {
        None
    };
    let Some(guard) = guard else {
        report(frame);
        return;
    };
    let mut msg = FixedBuf::<512>::new();
    let cur = cpu::get(Word::Current) as *const tcb::Tcb;
    // SAFETY: `Word::Current` holds the running thread's TCB (or 0).
    let owner = (!cur.is_null()).then(|| unsafe { tcb::from_raw(cur) });
    match owner {
        Some(t) if t.stack.get().is_some_and(|s| s.slot == guard.slot) => {
            let _ = write!(
                msg,
                "thread {} overflowed its stack",
                crate::thread::describe(t)
            );
        }
        _ => {
            let _ = write!(msg, "a thread overflowed its stack (slot {})", guard.slot);
        }
    }
    let _ = write!(
        msg,
        " (guard page hit at {:#x}, stack {:#x}..{:#x}, rip {:#x}, vCPU {})",
        frame.cr2,
        guard.lo,
        guard.hi,
        frame.rip,
        activm_stub::vcpu_id()
    );
    activm_stub::hypercall::panic(msg.as_bytes())
}

/// A fatal exception that is not a stack overflow: print what the runtime knows (the VMM's own
/// report follows when the instruction faults again).
fn report(frame: &ExceptionFrame) {
    use activm_stub::println;
    println!(
        "activm-rt: vCPU {} exception {} at rip {:#x} rsp {:#x} cr2 {:#x}: in_sched {} current {:#x} hold {} sched_top {:#x} activation {}",
        activm_stub::vcpu_id(),
        frame.vector,
        frame.rip,
        frame.rsp,
        frame.cr2,
        cpu::get(Word::InSched),
        cpu::get(Word::Current),
        activm_stub::preempt::held(),
        cpu::get(Word::SchedTop),
        cpu::get(Word::Activation),
    );
    crate::percpu::print_trace();
    let rsp = frame.rsp & !7;
    for i in 0..12u64 {
        let at = rsp.wrapping_sub(48) + 8 * i;
        if stack::guard_owner(at).is_none() && at > 0x20_0000 {
            // SAFETY: a diagnostic read near the faulting stack pointer (mapped RAM above the
            // image base; guard pages skipped).
            let v = unsafe { (at as *const u64).read_volatile() };
            println!("activm-rt:   [{at:#x}] = {v:#x}");
        }
    }
    crate::stats::dump();
}
