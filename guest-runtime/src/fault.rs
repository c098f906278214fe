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
    if frame.vector != PAGE_FAULT {
        return;
    }
    let Some(guard) = stack::guard_owner(frame.cr2) else {
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
