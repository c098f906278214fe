//! A vCPU's user context on aarch64: whether it can be taken, taking it, and starting a new
//! activation, each register through one `KVM_{GET,SET}_ONE_REG` (arm64 has no sync_regs).

use kvm_ioctls::VcpuFd;

use super::regs::{self, Reg};
use crate::error::Error;

/// PSTATE of a new activation: EL0t, interrupts on.
const PSTATE_EL0: u64 = 0;

/// Whether the vCPU is at EL0 with IRQs unmasked: the only place its context can be handed to
/// the guest. One `KVM_GET_ONE_REG`.
pub fn at_user_level(fd: &VcpuFd) -> bool {
    regs::get(fd, regs::PSTATE).is_ok_and(|p| p & 0xf == 0 && p & (1 << 7) == 0)
}

/// Whether a new activation has not run an instruction yet (PC and SP as `enter_activation`
/// left them).
pub fn at_activation_entry(fd: &VcpuFd, entry: u64, stack_top: u64) -> bool {
    regs::get(fd, regs::PC).is_ok_and(|pc| pc == entry)
        && regs::get(fd, regs::SP_EL0).is_ok_and(|sp| sp == stack_top)
}

/// The vCPU's EL0 context: 31 + 4 + 2 + 32 = 69 `KVM_GET_ONE_REG`s.
pub fn take_user_context(fd: &VcpuFd) -> Result<protocol::arch::aarch64::UserContext, Error> {
    let mut ctx = protocol::arch::aarch64::UserContext::default();
    for (n, x) in ctx.x.iter_mut().enumerate() {
        *x = regs::get(fd, regs::x(n as u64))?;
    }
    ctx.sp = regs::get(fd, regs::SP_EL0)?;
    ctx.pc = regs::get(fd, regs::PC)?;
    ctx.pstate = regs::get(fd, regs::PSTATE)?;
    ctx.tpidr_el0 = regs::get(fd, regs::TPIDR_EL0)?;
    ctx.fpcr = regs::get(fd, regs::FPCR)?;
    ctx.fpsr = regs::get(fd, regs::FPSR)?;
    for (n, q) in ctx.q.iter_mut().enumerate() {
        *q = regs::get_u128(fd, regs::v(n as u64))?;
    }
    Ok(ctx)
}

/// Start a new activation on this vCPU: EL0 at `entry` with x0 = vCPU index, x1 = activation
/// id, SP = `stack_top` (16-byte aligned, x30 = 0: no return), interrupts on. 6
/// `KVM_SET_ONE_REG`s.
pub fn enter_activation(fd: &mut VcpuFd, entry: u64, stack_top: u64, vcpu: u32, activation: u32) {
    let set: [(Reg, u64); 6] = [
        (regs::x(0), vcpu as u64),
        (regs::x(1), activation as u64),
        (regs::x(30), 0),
        (regs::SP_EL0, stack_top),
        (regs::PSTATE, PSTATE_EL0),
        (regs::PC, entry),
    ];
    for (reg, value) in set {
        if let Err(e) = regs::set(fd, reg, value) {
            // The vCPU cannot be pointed at the activation; it resumes where it was, which the
            // guest sees as a lost NEWPROC. Say so.
            eprintln!("activm: error: starting an activation on vCPU {vcpu}: {e}");
            return;
        }
    }
}
