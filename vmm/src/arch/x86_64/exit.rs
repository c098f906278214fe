//! What a vCPU exit means on x86_64: reading a hypercall's arguments and writing its result,
//! halting and waking, the instruction pointer for reports, and the timestamp counter.

use kvm_bindings::{kvm_mp_state, KVM_MP_STATE_HALTED, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{SyncReg, VcpuFd};

use super::abi;

/// Ask KVM to sync the general and system registers out on every exit (the hypercall
/// arguments, the user-level test and the context hand-over read them without an ioctl).
pub fn prepare_run(fd: &mut VcpuFd) {
    fd.set_sync_valid_reg(SyncReg::Register);
    fd.set_sync_valid_reg(SyncReg::SystemRegister);
}

/// The four arguments of the hypercall the vCPU exited on (`rdi`, `rsi`, `rdx`, `r10`, see
/// `protocol::hypercall`), from the registers KVM synced on exit.
pub fn hypercall_args(fd: &VcpuFd) -> [u64; 4] {
    let regs = fd.sync_regs().regs;
    [regs.rdi, regs.rsi, regs.rdx, regs.r10]
}

/// Set the result of the hypercall load the vCPU last exited on; KVM writes it to the load's
/// destination register when the vCPU next runs.
pub fn set_hypercall_result(fd: &mut VcpuFd, value: u64) {
    // Only called after a KVM_EXIT_MMIO for a hypercall (`mmio` is the active union field) and
    // hypercall loads are 8 bytes (checked when the call is decoded).
    fd.get_kvm_run().__bindgen_anon_1.mmio.data = value.to_le_bytes();
}

/// Where the vCPU is, for a report: `rip 0x...`.
pub fn describe_pc(fd: &VcpuFd) -> String {
    format!("rip {:#x}", fd.sync_regs().regs.rip)
}

/// Sleep inside KVM until an interrupt is pending (the `halt` hypercall).
pub fn halt(fd: &VcpuFd) -> Result<(), vmm_sys_util::errno::Error> {
    fd.set_mp_state(kvm_mp_state {
        mp_state: KVM_MP_STATE_HALTED,
    })
}

/// Wake a vCPU KVM may still hold halted, so a new activation runs at once.
pub fn make_runnable(fd: &VcpuFd) -> Result<(), vmm_sys_util::errno::Error> {
    fd.set_mp_state(kvm_mp_state {
        mp_state: KVM_MP_STATE_RUNNABLE,
    })
}

/// The guest's timestamp counter frequency in kHz (0: KVM does not say).
pub fn timestamp_khz(fd: &VcpuFd) -> u64 {
    fd.get_tsc_khz().map(u64::from).unwrap_or(0)
}

/// Read the host TSC (guest and host TSC agree: the VMM sets a zero TSC offset).
pub fn timestamp() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Which requested vectors [`undelivered_interrupt`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vectors {
    /// The upcall vector only (the upcall watchdog: a timer vector found requested at an exit
    /// is usually one that came while the vCPU was out of the guest).
    Upcall,
    /// The highest requested one, whatever it is (the interrupt watch: the guest's timer and
    /// reschedule vectors).
    Any,
}

/// Whether the vCPU (just out of `KVM_RUN`, registers synced) has a vector of `which` requested
/// in its local APIC and could take it now: interrupts on, the vector's priority class above
/// the processor priority (the task priority and the highest vector in service). One
/// `KVM_GET_LAPIC`.
pub fn undelivered_interrupt(
    fd: &VcpuFd,
    which: Vectors,
) -> Result<bool, vmm_sys_util::errno::Error> {
    if fd.sync_regs().regs.rflags & (1 << 9) == 0 {
        return Ok(false);
    }
    let apic = fd.get_lapic()?;
    let word = |reg: usize| {
        let b = &apic.regs[reg..reg + 4];
        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
    };
    // The highest vector set in the 256-bit register at `base` (eight 32-bit words, 16 apart).
    let highest = |base: usize| {
        (0..8u32).rev().find_map(|w| {
            let bits = word(base + 16 * w as usize);
            (bits != 0).then(|| w * 32 + 31 - bits.leading_zeros())
        })
    };
    const TPR: usize = 0x80;
    const ISR: usize = 0x100;
    const IRR: usize = 0x200;
    let requested = match which {
        Vectors::Upcall => {
            let upcall = u32::from(abi::UPCALL_IRQ);
            let set = word(IRR + 16 * (upcall as usize / 32)) & (1 << (upcall % 32)) != 0;
            set.then_some(upcall)
        }
        Vectors::Any => highest(IRR),
    };
    let Some(requested) = requested else {
        return Ok(false);
    };
    let in_service = highest(ISR).unwrap_or(0);
    Ok(requested & 0xf0 > (word(TPR) & 0xf0).max(in_service & 0xf0))
}

/// Whether KVM holds the vCPU halted (waiting for an interrupt). One `KVM_GET_MP_STATE`.
pub fn halted(fd: &VcpuFd) -> Result<bool, vmm_sys_util::errno::Error> {
    Ok(fd.get_mp_state()?.mp_state == KVM_MP_STATE_HALTED)
}
