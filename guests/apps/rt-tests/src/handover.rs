//! `fault-handover`: a thread faults, and while its CPU-exception handler reports the fault (on
//! its vCPU's exception stack, under a preemption hold) the simulated VMM takes it away and hands
//! its context to another vCPU. That context is the handler's, not the thread's: continued as
//! the thread's, it stopped the guest with "would resume with stack pointer ... outside its
//! stack". It must be continued as the handler, which ends the guest as any fault does: the
//! handler's report (now counting `exception_contexts: 1`), then the VMM's, status 125 (also
//! when no kick landed before the report ended: no count then). Needs the simulated VMM
//! (`activm run --no-activations`) and 2 vCPUs.

use core::sync::atomic::{AtomicBool, Ordering};

use activm_rt::upcall::sim;
use activm_rt::{println, rt, thread};

pub fn fault_handover() -> i32 {
    static READY: AtomicBool = AtomicBool::new(false);
    static GO: AtomicBool = AtomicBool::new(false);
    if rt::nr_vcpus() < 2 {
        println!("fault-handover: needs 2 vCPUs");
        return 1;
    }
    let faulter = thread::Builder::new()
        .name("faulter".into())
        .spawn(|| {
            READY.store(true, Ordering::Release);
            while !GO.load(Ordering::Acquire) {
                core::hint::spin_loop();
            }
            crate::regs::undefined_instruction()
        })
        .unwrap();
    // This thread keeps running (no sleep) so that it is on the other vCPU when the faulter's
    // handler holds its own vCPU, and kicks until the capture.
    while !READY.load(Ordering::Acquire) {
        thread::yield_now();
    }
    // Only while it holds a preemption hold: in its thread code it holds none, so the capture
    // lands in the handler, which holds one from its start to the guest's end.
    let req = sim::request(
        sim::Capture::Preempt {
            deliver_to: rt::vcpu(),
        },
        Some(&faulter.thread()),
        Some(true),
    );
    GO.store(true, Ordering::Release);
    let deadline = rt::rdtsc() + 10_000 * rt::tsc_khz();
    while !req.is_done() && rt::rdtsc() < deadline {
        sim::kick_all();
        for _ in 0..1000 {
            core::hint::spin_loop();
        }
    }
    // The guest ends with the fault before this returns.
    let _ = faulter.join();
    println!(
        "fault-handover: the faulting thread returned (taken in its handler: {})",
        req.is_done()
    );
    1
}

/// How a context taken in the exception handler is rewound (`fault::faulting_context`), on a
/// made-up exception stack: from the frame and its FXSAVE image once the entry saved them, from
/// the context's own registers before, and not at all once the handler holds locks (or for an
/// interrupt nested in the entry before the frame was saved).
#[cfg(target_arch = "x86_64")]
pub fn exception_context_rewind() -> crate::TestResult {
    use activm_rt::fault::faulting_context;
    use activm_stub::arch::x86_64::{
        exception_stack_layout, user_exception_window, EXCEPTION_HANDLER_HOLDS,
        EXCEPTION_NOT_SAVED, EXCEPTION_SAVED,
    };
    use activm_stub::protocol::arch::x86_64::{FxsaveArea, UserContext};
    use activm_stub::ExceptionFrame;
    use alloc::format;

    let mut stack = alloc::vec![0u8; 4096];
    let top = (stack.as_mut_ptr() as u64 + 4096) & !15;
    let at = exception_stack_layout(top);
    // The faulting code's registers as the entry saved them: r15 = 15, ..., rax = 1 (their
    // `ExceptionFrame` order), rip/rsp/rflags recognisable; its FXSAVE image all 0x5a.
    let frame = ExceptionFrame {
        r15: 15,
        r14: 14,
        r13: 13,
        r12: 12,
        r11: 11,
        r10: 10,
        r9: 9,
        r8: 8,
        rbp: 7,
        rdi: 6,
        rsi: 5,
        rdx: 4,
        rcx: 3,
        rbx: 2,
        rax: 1,
        vector: 6,
        error_code: 0,
        cr2: 0,
        rip: 0x2222,
        rflags: 0x246,
        rsp: 0x3333,
    };
    // SAFETY: the layout's addresses lie inside `stack` (under its 16-byte-aligned top).
    unsafe {
        (at.frame as *mut ExceptionFrame).write(frame);
        (at.fxsave as *mut FxsaveArea).write(FxsaveArea([0x5a; 512]));
    }
    let set_mark = |mark: u64| {
        // SAFETY: as above.
        unsafe { (at.saved_mark as *mut u64).write_volatile(mark) }
    };
    // What the VMM took: the handler's own registers (all 0x77), its FXSAVE image all 0x11.
    let mut ctx = UserContext::default();
    ctx.gprs.rax = 0x77;
    ctx.gprs.r15 = 0x77;
    ctx.gprs.rsp = top - 700;
    ctx.fxsave = FxsaveArea([0x11; 512]);
    let w = user_exception_window();
    let body = exception_context_rewind as *const () as u64;
    // (pc, mark, rewound?, GPRs from the frame?, FP state from the frame?)
    let cases = [
        (w.start, EXCEPTION_NOT_SAVED, true, false, false),
        (w.pushed, EXCEPTION_NOT_SAVED, true, true, false),
        (body, EXCEPTION_SAVED, true, true, true),
        (body, EXCEPTION_HANDLER_HOLDS, false, false, false),
        (body, EXCEPTION_NOT_SAVED, false, false, false),
        (w.returned, EXCEPTION_HANDLER_HOLDS, true, true, true),
    ];
    for (i, &(pc, mark, rewound, gprs, fp)) in cases.iter().enumerate() {
        set_mark(mark);
        ctx.rip = pc;
        let got = faulting_context(&ctx, top);
        let Some(got) = got else {
            if rewound {
                return Err(format!("case {i}: not rewound"));
            }
            continue;
        };
        let want_gprs = if gprs { (1, 15) } else { (0x77, 0x77) };
        let want_fp = if fp { 0x5a } else { 0x11 };
        let ok = rewound
            && (got.gprs.rax, got.gprs.r15) == want_gprs
            && got.fxsave.0[100] == want_fp
            && (got.rip, got.gprs.rsp, got.rflags) == (0x2222, 0x3333, 0x246);
        if !ok {
            return Err(format!(
                "case {i} (pc {pc:#x}, mark {mark}): rax {:#x} r15 {:#x} fp {:#x} rip {:#x} \
                 rsp {:#x} rflags {:#x}",
                got.gprs.rax, got.gprs.r15, got.fxsave.0[100], got.rip, got.gprs.rsp, got.rflags
            ));
        }
    }
    Ok(format!("{} cases", cases.len()))
}

#[cfg(not(target_arch = "x86_64"))]
pub fn exception_context_rewind() -> crate::TestResult {
    Err("skipped: the exception frame's layout is x86_64's".into())
}
