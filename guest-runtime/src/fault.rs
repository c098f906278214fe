//! CPU exceptions at user level (CPL3, EL0). The stub delivers them to [`on_exception`] on the
//! vCPU's alternate stack (with the fault address, CR2 or FAR_EL1, read at CPL0 or EL1). A page
//! fault in the guard page of a thread stack ends the guest with "thread 'name' overflowed its
//! stack"; anything else returns, so the faulting instruction runs again with exceptions fatal
//! and the VMM reports it as before.
//!
//! A context the VMM takes while the handler runs is the handler's, on the exception stack, not
//! the thread's (`exception_stack::handler_context`).

use core::fmt::Write;

use activm_stub::console::FixedBuf;
use activm_stub::{preempt, ExceptionFrame};

use crate::arch::cpu::{self, Word};
use crate::arch::fault as exc;
use crate::stack;
use crate::tcb;

#[doc(hidden)]
pub use crate::arch::fault::{faulting_context, fp_control_load};

pub fn on_exception(frame: &mut ExceptionFrame) {
    // From here on a context taken in this handler is continued as it is (it holds the hold
    // below, and the console's lock while it prints), not rewound to the faulting instruction.
    exc::mark_handler_holds(frame);
    // Never released: this vCPU either ends the guest or re-faults fatally.
    preempt::hold();
    let guard = exc::page_fault_address(frame).and_then(stack::guard_owner);
    let Some(guard) = guard else {
        crate::activation::poison::explain_fault(
            exc::number(frame),
            exc::pc(frame),
            exc::sp(frame),
            exc::fault_address(frame),
            |v| exc::any_register(frame, v),
        );
        explain_fp_control_fault(frame);
        report(frame);
        return;
    };
    let mut msg = FixedBuf::<512>::new();
    let cur = cpu::get(Word::Current) as *const tcb::Tcb;
    // SAFETY: `Word::Current` holds the running thread's TCB (or 0).
    let owner = (!cur.is_null()).then(|| unsafe { tcb::from_raw(cur) });
    match owner {
        Some(t) if t.stack.get().is_some_and(|s| s.slot == guard.slot) => {
            let _ = write!(msg, "thread {} overflowed its stack", tcb::describe(t));
        }
        _ => {
            let _ = write!(msg, "a thread overflowed its stack (slot {})", guard.slot);
        }
    }
    let _ = write!(
        msg,
        " (guard page hit at {:#x}, stack {:#x}..{:#x}, pc {:#x}, vCPU {})",
        exc::fault_address(frame),
        guard.lo,
        guard.hi,
        exc::pc(frame),
        activm_stub::vcpu_id()
    );
    activm_stub::hypercall::panic(msg.as_bytes())
}

/// An invalid-opcode fault on an instruction that loads FP control state (which ones:
/// `arch::fault::fp_control_load`). Such an instruction is valid here (CR4.OSFXSR is set from
/// boot and never changed; an instruction KVM cannot emulate ends the guest with an internal
/// error, not a `#UD`), but our hosts raise `#UD`, not `#GP`, for an MXCSR value with reserved
/// bits set (`rt-tests fault bad-mxcsr`): the value loaded was not one a context saved, so the
/// frame it came from was overwritten (the soak saw this at the `ldmxcsr` of a switch-in while
/// two threads could share a stack). Says so, with the value where the operand is readable.
fn explain_fp_control_fault(frame: &ExceptionFrame) {
    let readable = |at: u64| at >= 0x20_0000 && stack::guard_owner(at).is_none();
    let Some(pc) = exc::fp_control_fault(frame, readable) else {
        return;
    };
    let vcpu = activm_stub::vcpu_id();
    let what = "the value has reserved bits, so the frame it was loaded from is not a saved \
                context (its stack was overwritten?)";
    match exc::fp_control_mxcsr(frame, readable) {
        Some(v) => activm_stub::println!(
            "activm-rt: vCPU {vcpu}: #UD on an FP-control load at {pc:#x} (MXCSR value {v:#x}): {what}"
        ),
        None => activm_stub::println!(
            "activm-rt: vCPU {vcpu}: #UD on an FP-control load at {pc:#x}: {what}"
        ),
    }
}

/// A fatal exception that is not a stack overflow: print what the runtime knows (the VMM's own
/// report follows when the instruction faults again).
fn report(frame: &ExceptionFrame) {
    use activm_stub::println;
    println!(
        "activm-rt: vCPU {} exception {} at pc {:#x} sp {:#x} fault address {:#x}: in_sched {} current {:#x} hold {} sched_top {:#x} activation {}",
        activm_stub::vcpu_id(),
        exc::number(frame),
        exc::pc(frame),
        exc::sp(frame),
        exc::fault_address(frame),
        cpu::get(Word::InSched),
        cpu::get(Word::Current),
        activm_stub::preempt::held(),
        cpu::get(Word::SchedTop),
        cpu::get(Word::Activation),
    );
    crate::percpu::print_trace();
    let sp = exc::sp(frame) & !7;
    for i in 0..12u64 {
        let at = sp.wrapping_sub(48) + 8 * i;
        if stack::guard_owner(at).is_none() && at > 0x20_0000 {
            // SAFETY: a diagnostic read near the faulting stack pointer (mapped RAM above the
            // image base; guard pages skipped).
            let v = unsafe { (at as *const u64).read_volatile() };
            println!("activm-rt:   [{at:#x}] = {v:#x}");
        }
    }
    crate::stats::dump();
}
