//! aarch64: every vCPU enters at EL1 with the MMU on, on VMM-built page tables, and the guest
//! stub drops to EL0 at once. The interrupt controller is KVM's in-kernel GICv3; PSCI 0.2 is
//! enabled but unused (the VMM starts every vCPU at the entry itself, through ONE_REG).

pub mod boot;
pub mod context;
pub mod exit;
pub mod layout;
pub mod preempt;
pub mod regs;
pub mod seccomp;
pub mod vcpu;

pub use protocol::arch::aarch64 as abi;

/// The ELF machine number guests for this architecture carry.
pub const ELF_MACHINE: u16 = 183; // EM_AARCH64

/// KVM capabilities this back end needs besides the common ones (no sync_regs on arm64:
/// registers move through ONE_REG; the upcall is an SPI, not an MSI).
pub const REQUIRED_CAPS: &[(kvm_ioctls::Cap, &str)] = &[
    (kvm_ioctls::Cap::Irqchip, "KVM_CAP_IRQCHIP"),
    (kvm_ioctls::Cap::OneReg, "KVM_CAP_ONE_REG"),
];

/// What an internal error (an instruction KVM could not emulate) most likely means here.
pub const INTERNAL_ERROR_HINT: &str =
    "a load or store KVM could not decode (writeback or pair access to an unbacked address?)";

/// aarch64 code for a guest that breaks the protocol at once: a store to the hypercall page
/// (`movz x0, #0xfeb0, lsl #16; str x1, [x0]`), which the VMM stops as a malformed hypercall.
pub const TRIPLE_FAULT_CODE: &[u8] = &[
    0x00, 0xd6, 0xbf, 0xd2, // movz x0, #0xfeb0, lsl #16
    0x01, 0x00, 0x00, 0xf9, // str x1, [x0]
];

/// `BootInfo::irq_controller_base`: the GICv3 distributor.
pub const IRQ_CONTROLLER_BASE: u64 = abi::GICD_BASE;

use std::sync::Mutex;

use kvm_bindings::{
    kvm_create_device, kvm_device_attr, kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3, kvm_vcpu_init,
    KVM_DEV_ARM_VGIC_CTRL_INIT, KVM_DEV_ARM_VGIC_GRP_ADDR, KVM_DEV_ARM_VGIC_GRP_CTRL,
    KVM_VGIC_V3_ADDR_TYPE_DIST, KVM_VGIC_V3_ADDR_TYPE_REDIST,
};
use kvm_ioctls::{DeviceFd, Kvm, VcpuFd, VmFd};

use crate::error::Error;
use crate::memory::Plan;

/// Per-VM aarch64 state: the vGIC device (initialised once every vCPU exists) and the vCPU
/// target (`KVM_ARM_PREFERRED_TARGET`, with PSCI 0.2).
#[derive(Debug)]
pub struct ArchVm {
    gic: DeviceFd,
    target: kvm_vcpu_init,
    initialised: Mutex<bool>,
}

fn set_attr(
    dev: &DeviceFd,
    group: u32,
    attr: u64,
    addr: u64,
    what: &'static str,
) -> Result<(), Error> {
    let attr = kvm_device_attr {
        group,
        attr,
        addr,
        flags: 0,
    };
    dev.set_device_attr(&attr).map_err(Error::kvm(what))
}

/// Create the in-kernel GICv3 and place its distributor and redistributors.
pub fn setup_vm(_kvm: &Kvm, vm: &VmFd) -> Result<ArchVm, Error> {
    let mut device = kvm_create_device {
        type_: kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3,
        fd: 0,
        flags: 0,
    };
    let gic = vm
        .create_device(&mut device)
        .map_err(Error::kvm("KVM_CREATE_DEVICE(GICv3)"))?;
    for (kind, base) in [
        (KVM_VGIC_V3_ADDR_TYPE_DIST, abi::GICD_BASE),
        (KVM_VGIC_V3_ADDR_TYPE_REDIST, abi::GICR_BASE),
    ] {
        set_attr(
            &gic,
            KVM_DEV_ARM_VGIC_GRP_ADDR,
            u64::from(kind),
            &base as *const u64 as u64,
            "KVM_SET_DEVICE_ATTR(GICv3 address)",
        )?;
    }
    let mut target = kvm_vcpu_init::default();
    vm.get_preferred_target(&mut target)
        .map_err(Error::kvm("KVM_ARM_PREFERRED_TARGET"))?;
    target.features[0] |= 1 << kvm_bindings::KVM_ARM_VCPU_PSCI_0_2;
    Ok(ArchVm {
        gic,
        target,
        initialised: Mutex::new(false),
    })
}

/// `KVM_ARM_VCPU_INIT` and the boot registers; after the last vCPU, initialise the vGIC (KVM
/// wants every vCPU created first).
pub fn configure_vcpu(fd: &VcpuFd, arch: &ArchVm, index: u32, plan: &Plan) -> Result<(), Error> {
    fd.vcpu_init(&arch.target)
        .map_err(Error::kvm("KVM_ARM_VCPU_INIT"))?;
    vcpu::configure(fd, index, plan)?;
    if index + 1 == plan.nr_vcpus {
        let mut done = arch.initialised.lock().unwrap_or_else(|e| e.into_inner());
        if !*done {
            set_attr(
                &arch.gic,
                KVM_DEV_ARM_VGIC_GRP_CTRL,
                u64::from(KVM_DEV_ARM_VGIC_CTRL_INIT),
                0,
                "KVM_SET_DEVICE_ATTR(GICv3 init)",
            )?;
            *done = true;
        }
    }
    Ok(())
}

/// The `--stats` line: register ioctls over the whole run (every guest of this process). Per
/// event: 14 sets per vCPU at boot, 4 gets per hypercall exit, 1 get per preemption check, 69
/// gets per captured user context, 6 sets per new activation, 2 gets per activation-entry check.
pub fn register_transfer_stats() -> Option<String> {
    let (gets, sets) = regs::transfers();
    Some(format!(
        "register transfers: KVM_GET_ONE_REG={gets} KVM_SET_ONE_REG={sets}"
    ))
}

/// `KVM_IRQ_LINE` irq field: type SPI (1) in bits 24..27, the INTID in bits 0..15.
const IRQ_TYPE_SPI: u32 = 1 << 24;

/// Raise vCPU `vcpu`'s upcall SPI (edge-triggered, routed to it by the guest): one VM ioctl, no
/// vCPU exit on the sender's side. Raising an edge-triggered line latches it pending; it is
/// never lowered.
pub fn send_upcall_interrupt(vm: &VmFd, vcpu: u32) -> Result<(), vmm_sys_util::errno::Error> {
    vm.set_irq_line(IRQ_TYPE_SPI | (abi::INTID_UPCALL_BASE + vcpu), true)
}

/// Wake an idle vCPU for an I/O completion (`protocol::blk::BlkRing`). KVM cannot inject an
/// SGI from user space, so this raises the same per-vCPU SPI: the guest's handler finds no
/// record and its scheduler loop takes the completions.
pub fn send_wakeup_interrupt(vm: &VmFd, vcpu: u32) -> Result<(), vmm_sys_util::errno::Error> {
    send_upcall_interrupt(vm, vcpu)
}
