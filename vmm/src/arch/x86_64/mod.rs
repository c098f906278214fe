//! x86_64: the guest enters at CPL0 in long mode with VMM-built GDT, TSS, IDT and page tables.

pub mod boot;
pub mod context;
pub mod exit;
pub mod layout;
pub mod preempt;
pub mod seccomp;
pub mod vcpu;

pub use protocol::arch::x86_64 as abi;

/// The ELF machine number guests for this architecture carry.
pub const ELF_MACHINE: u16 = 62; // EM_X86_64

/// `BootInfo::irq_controller_base`: the local APIC.
pub const IRQ_CONTROLLER_BASE: u64 = abi::LAPIC_BASE;

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};

use crate::error::Error;
use crate::memory::Plan;

/// The KVM capabilities this back end needs beyond the common ones: the in-kernel irqchip
/// and MSIs (the upcall interrupt), synced registers (hypercall arguments without an ioctl).
pub const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
    (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
    (Cap::SignalMsi, "KVM_CAP_SIGNAL_MSI"),
];

/// What an internal error (an instruction KVM could not emulate) most likely means here.
pub const INTERNAL_ERROR_HINT: &str = "at CPL0: no SSE or xgetbv there";

/// Per-VM x86_64 state the vCPUs are configured from.
#[derive(Debug)]
pub struct ArchVm {
    cpuid: CpuId,
}

/// Create the in-kernel interrupt controller and read the CPUID template.
pub fn setup_vm(kvm: &Kvm, vm: &VmFd) -> Result<ArchVm, Error> {
    vm.create_irq_chip()
        .map_err(Error::kvm("KVM_CREATE_IRQCHIP"))?;
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::kvm("KVM_GET_SUPPORTED_CPUID"))?;
    Ok(ArchVm { cpuid })
}

pub fn configure_vcpu(fd: &VcpuFd, arch: &ArchVm, index: u32, plan: &Plan) -> Result<(), Error> {
    vcpu::configure(fd, &arch.cpuid, index, plan)
}

/// Register transfers are not counted here: they ride in `kvm_run` (sync_regs).
pub fn register_transfer_stats() -> Option<String> {
    None
}

/// Raise the upcall interrupt on `vcpu` (its APIC id is its index) through the in-kernel
/// irqchip: one VM ioctl, no vCPU exit on the sender's side.
pub fn send_upcall_interrupt(vm: &VmFd, vcpu: u32) -> Result<(), vmm_sys_util::errno::Error> {
    send_interrupt(vm, vcpu, abi::UPCALL_IRQ)
}

/// Raise the reschedule vector on `vcpu` the same way: wakes an idle vCPU for an I/O
/// completion (`protocol::blk::BlkRing`).
pub fn send_wakeup_interrupt(vm: &VmFd, vcpu: u32) -> Result<(), vmm_sys_util::errno::Error> {
    send_interrupt(vm, vcpu, abi::RESCHEDULE_IRQ)
}

fn send_interrupt(vm: &VmFd, vcpu: u32, vector: u8) -> Result<(), vmm_sys_util::errno::Error> {
    let msi = kvm_bindings::kvm_msi {
        address_lo: abi::LAPIC_BASE as u32 | (vcpu << 12),
        address_hi: 0,
        data: u32::from(vector),
        ..Default::default()
    };
    vm.signal_msi(msi).map(|_| ())
}

/// x86_64 code that loads an empty IDT and raises #UD: a triple fault.
pub const TRIPLE_FAULT_CODE: &[u8] = &[
    0x0f, 0x01, 0x1d, 0x02, 0x00, 0x00, 0x00, // lidt 2(%rip)
    0x0f, 0x0b, // ud2
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // the empty IDT descriptor
];
