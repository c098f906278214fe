//! Each vCPU's alternate stack for CPU exceptions (`fault`'s handler runs on it), as the
//! scheduler and the upcall handler see it: a thread continued inside the handler has its stack
//! pointer there.

use core::sync::atomic::Ordering;

use crate::arch::fault as exc;
use crate::arch::{context, UserContext};

/// Size of each vCPU's alternate stack for CPU exceptions.
pub(crate) const EXCEPTION_STACK: usize = 16 * 1024;

/// The exception stack (vCPU, top) that `sp` lies on, if any.
fn exception_stack_of(sp: u64) -> Option<(usize, u64)> {
    crate::percpu::pcpus()
        .iter()
        .enumerate()
        .find_map(|(v, p)| {
            let top = p.exception_stack.load(Ordering::Relaxed);
            (top != 0 && sp <= top && sp > top - EXCEPTION_STACK as u64).then_some((v, top))
        })
}

/// Whether `sp` lies on a vCPU's exception stack (a thread continued inside its handler).
pub(crate) fn on_exception_stack(sp: u64) -> bool {
    exception_stack_of(sp).is_some()
}

/// A context the VMM took (from a record) while a CPU-exception handler ran is not the
/// thread's own: its stack pointer is on the exception stack of the vCPU it was taken from.
/// Where the handler holds nothing of its own (the entry, before `fault::on_exception` marks the
/// frame, and the return path), it is replaced by the faulting context (the faulting instruction
/// runs again, as the handler's return would: `arch::fault::faulting_context`) and that vCPU's
/// exception stack, disarmed by the delivery and abandoned now, is armed again. Otherwise it is
/// left to be continued as it is, on that stack (which stays disarmed): before, it was resumed
/// as a context of the thread and stopped the guest with "would resume with stack pointer ...
/// outside its stack" (`rt-tests fault-handover`). Returns whether `ctx` was on an exception
/// stack.
pub(crate) fn handler_context(ctx: &mut UserContext) -> bool {
    let Some((vcpu, top)) = exception_stack_of(context::sp(ctx)) else {
        return false;
    };
    crate::percpu::bump(&crate::percpu::this().counters.exception_contexts);
    if let Some(faulting) = exc::faulting_context(ctx, top) {
        *ctx = faulting;
        activm_stub::cpu_local::cpu_local(vcpu)
            .exception_stack()
            .store(top, Ordering::Release);
    }
    true
}
