//! What a vCPU exit means on aarch64: hypercall arguments (four `KVM_GET_ONE_REG`s: arm64 KVM
//! has no synced registers) and result (through `kvm_run`, no ioctl), halting and waking, the
//! PC for reports, and the virtual counter.

use kvm_bindings::{kvm_mp_state, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::VcpuFd;

use super::regs;

/// Nothing to ask for: arm64 KVM syncs no registers into `kvm_run`.
pub fn prepare_run(_fd: &mut VcpuFd) {}

/// The four arguments of the hypercall the vCPU exited on (`x0..x3`): four ONE_REG reads.
/// A register that cannot be read gives `u64::MAX`, which every call rejects as an argument.
pub fn hypercall_args(fd: &VcpuFd) -> [u64; 4] {
    let mut args = [0u64; 4];
    for (n, arg) in args.iter_mut().enumerate() {
        *arg = regs::get(fd, regs::x(n as u64)).unwrap_or(u64::MAX);
    }
    args
}

/// Set the result of the hypercall load the vCPU last exited on; KVM writes it to the load's
/// destination register when the vCPU next runs.
pub fn set_hypercall_result(fd: &mut VcpuFd, value: u64) {
    // Only called after a KVM_EXIT_MMIO for a hypercall (`mmio` is the active union field).
    fd.get_kvm_run().__bindgen_anon_1.mmio.data = value.to_le_bytes();
}

/// Where the vCPU is, for a report: `pc 0x...`.
pub fn describe_pc(fd: &VcpuFd) -> String {
    match regs::get(fd, regs::PC) {
        Ok(pc) => format!("pc {pc:#x}"),
        Err(e) => format!("pc unknown ({e})"),
    }
}

/// The `halt` hypercall: the guest sleeps with `wfi` at EL0 instead (not trapped: SCTLR_EL1.nTWI),
/// which KVM turns into a sleep until an interrupt; the hypercall itself returns at once.
pub fn halt(_fd: &VcpuFd) -> Result<(), vmm_sys_util::errno::Error> {
    Ok(())
}

/// Wake a vCPU KVM may still hold, so a new activation runs at once.
pub fn make_runnable(fd: &VcpuFd) -> Result<(), vmm_sys_util::errno::Error> {
    fd.set_mp_state(kvm_mp_state {
        mp_state: KVM_MP_STATE_RUNNABLE,
    })
}

/// The counter frequency (CNTFRQ_EL0, the same in host and guest) in kHz.
pub fn timestamp_khz(_fd: &VcpuFd) -> u64 {
    let freq: u64;
    // SAFETY: reading CNTFRQ_EL0 at EL0 has no side effects.
    unsafe { std::arch::asm!("mrs {}, cntfrq_el0", out(reg) freq, options(nomem, nostack)) };
    freq / 1000
}

/// The host's virtual counter (the guest's follows it: `vcpu::configure` sets
/// `KVM_REG_ARM_TIMER_CNT` from it).
pub fn timestamp() -> u64 {
    let count: u64;
    // SAFETY: reading CNTVCT_EL0 at EL0 has no side effects (Linux enables EL0 access).
    unsafe {
        std::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) count, options(nomem, nostack))
    };
    count
}

/// Which requested interrupts [`undelivered_interrupt`] looks at (as on x86_64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vectors {
    Upcall,
    Any,
}

/// Whether a requested interrupt was left undelivered (the x86_64 port's kvm_pvm problem): arm64
/// KVM has shown no such thing, so there is nothing to look at.
pub fn undelivered_interrupt(
    _fd: &VcpuFd,
    _which: Vectors,
) -> Result<bool, vmm_sys_util::errno::Error> {
    Ok(false)
}

/// Whether KVM holds the vCPU halted: the guest's `wfi` is no KVM state on arm64, and a halt
/// there ends with any interrupt, so never.
pub fn halted(_fd: &VcpuFd) -> Result<bool, vmm_sys_util::errno::Error> {
    Ok(false)
}
