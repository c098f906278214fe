//! A vCPU's user context on x86_64: whether it can be taken, taking it, and starting a new
//! activation, all through the registers KVM syncs on every exit (no ioctl but one XSAVE).

use kvm_bindings::kvm_regs;
use kvm_ioctls::VcpuFd;

use crate::error::Error;

/// Whether the vCPU (just out of `KVM_RUN`, registers synced) is at CPL3 with interrupts on:
/// the only place its context can be handed to the guest.
pub fn at_user_level(fd: &VcpuFd) -> bool {
    let sync = fd.sync_regs();
    sync.sregs.cs.dpl == 3 && sync.regs.rflags & (1 << 9) != 0
}

/// The vCPU's user context: registers and segment bases from the synced state, FP/SSE state
/// from one `KVM_GET_XSAVE` (its first 512 bytes are the FXSAVE image).
pub fn take_user_context(fd: &VcpuFd) -> Result<protocol::arch::x86_64::UserContext, Error> {
    use protocol::arch::x86_64::{FxsaveArea, Gprs, UserContext};
    let sync = fd.sync_regs();
    let r = sync.regs;
    let xsave = fd.get_xsave().map_err(Error::kvm("KVM_GET_XSAVE"))?;
    let mut fxsave = [0u8; 512];
    for (chunk, word) in fxsave.chunks_exact_mut(4).zip(xsave.region.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Ok(UserContext {
        gprs: Gprs {
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            rbp: r.rbp,
            rsp: r.rsp,
            r8: r.r8,
            r9: r.r9,
            r10: r.r10,
            r11: r.r11,
            r12: r.r12,
            r13: r.r13,
            r14: r.r14,
            r15: r.r15,
        },
        rip: r.rip,
        rflags: r.rflags,
        fs_base: sync.sregs.fs.base,
        gs_base: sync.sregs.gs.base,
        _reserved: [0; 4],
        fxsave: FxsaveArea(fxsave),
    })
}

/// Start a new activation on this vCPU: CPL3 at `entry` with `rdi` = vCPU index, `rsi` =
/// activation id and `rsp` = `stack_top - 8` (a zero return address, as after a call), through
/// the synced registers (no ioctl). The vCPU was parked at CPL3, so its segments are user ones.
pub fn enter_activation(fd: &mut VcpuFd, entry: u64, stack_top: u64, vcpu: u32, activation: u32) {
    let regs = &mut fd.sync_regs_mut().regs;
    *regs = kvm_regs {
        rip: entry,
        rsp: stack_top - 8,
        rdi: vcpu as u64,
        rsi: activation as u64,
        rflags: 0x202,
        ..Default::default()
    };
    fd.set_sync_dirty_reg(kvm_ioctls::SyncReg::Register);
}

/// Whether the vCPU still stands where [`enter_activation`] put it (`entry`, `stack_top`): the
/// new activation has not run one instruction.
pub fn at_activation_entry(fd: &VcpuFd, entry: u64, stack_top: u64) -> bool {
    let regs = fd.sync_regs().regs;
    regs.rip == entry && regs.rsp == stack_top - 8
}
