//! CPU exceptions at CPL3. The stub delivers them to [`on_exception`] on the vCPU's alternate
//! stack (with CR2 read at CPL0). A page fault in the guard page of a thread stack ends the
//! guest with "thread 'name' overflowed its stack"; anything else returns, so the faulting
//! instruction runs again with exceptions fatal and the VMM reports it as before.

use core::fmt::Write;
use core::sync::atomic::Ordering;

use activm_stub::console::FixedBuf;
use activm_stub::{preempt, ExceptionFrame};

use crate::arch::cpu::{self, Word};
use crate::stack;
use crate::tcb;

/// #PF.
const PAGE_FAULT: u64 = 14;

/// #UD.
const INVALID_OPCODE: u64 = 6;
/// Consecutive retries of one `#UD` before it is reported as fatal.
const UD_RETRIES: u32 = 3;

pub fn on_exception(frame: &mut ExceptionFrame) {
    if frame.vector == INVALID_OPCODE && retry_fp_control_ud(frame.rip) {
        return;
    }
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

/// A `#UD` on an instruction that loads FP/SSE control state (`ldmxcsr`, `fldcw`, `fxrstor`)
/// at CPL3, where CR4.OSFXSR is set from boot and never changed: the instruction is valid, yet
/// the soak saw it raise `#UD` twice in ~80 runs (both times the `ldmxcsr` of the first switch
/// into a new thread) and run fine when executed again; the host's instruction emulator, which
/// has no SSE, is our suspect. Such a fault is retried (the exception stack re-armed), up to
/// [`UD_RETRIES`] times in a row at one address; anything else is reported as before.
fn retry_fp_control_ud(rip: u64) -> bool {
    if rip < 0x20_0000 || stack::guard_owner(rip).is_some() {
        return false;
    }
    // SAFETY: the faulting instruction's first bytes, in this guest's mapped image (checked
    // above to be above the image base and not a guard page).
    let b = unsafe { core::ptr::read_volatile(rip as *const [u8; 4]) };
    if !fp_control_load(b) {
        return false;
    }
    let p = crate::percpu::this();
    let n = if p.ud_retry_rip.swap(rip, Ordering::Relaxed) == rip {
        p.ud_retries.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        p.ud_retries.store(1, Ordering::Relaxed);
        1
    };
    if n > UD_RETRIES {
        return false;
    }
    crate::percpu::bump(&p.counters.ud_retries);
    activm_stub::println!(
        "activm-rt: vCPU {}: #UD on a valid FP-control instruction at {rip:#x}; retrying it",
        activm_stub::vcpu_id()
    );
    activm_stub::arm_exception_stack(p.exception_stack.load(Ordering::Relaxed));
    true
}

/// Whether an instruction starting with `b` loads FP/SSE control state: after an optional REX
/// prefix, 0F AE /1 (`fxrstor`), 0F AE /2 (`ldmxcsr`) or D9 /5 (`fldcw`), with a memory operand.
#[doc(hidden)]
pub fn fp_control_load(b: [u8; 4]) -> bool {
    let i = usize::from(b[0] & 0xf0 == 0x40);
    let mem_reg = |modrm: u8| (modrm >> 6 != 3, (modrm >> 3) & 7);
    match (b[i], b[i + 1]) {
        (0x0f, 0xae) => matches!(mem_reg(b[i + 2]), (true, 1 | 2)),
        (0xd9, modrm) => mem_reg(modrm) == (true, 5),
        _ => false,
    }
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
