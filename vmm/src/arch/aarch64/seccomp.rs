//! What the seccomp filters need to know about aarch64: the target, and the KVM ioctl requests
//! each thread kind makes once the guests are set up.

use kvm_bindings::{kvm_irq_level, kvm_mp_state, kvm_one_reg, KVMIO};
use seccompiler::TargetArch;

pub const TARGET: TargetArch = TargetArch::aarch64;
/// aarch64 has no pre-`*at` calls: the `*at` call stands in for them.
pub const LEGACY_OPEN: libc::c_long = libc::SYS_openat;
pub const LEGACY_UNLINK: libc::c_long = libc::SYS_unlinkat;

vmm_sys_util::ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
vmm_sys_util::ioctl_iow_nr!(KVM_IRQ_LINE, KVMIO, 0x61, kvm_irq_level);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_mp_state);
vmm_sys_util::ioctl_iow_nr!(KVM_GET_ONE_REG, KVMIO, 0xab, kvm_one_reg);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_ONE_REG, KVMIO, 0xac, kvm_one_reg);

/// A vCPU thread's: run, halt state, registers through ONE_REG (hypercall arguments, preempted
/// contexts, new activations, dumps), upcall interrupts (an SPI raised on the VM fd).
pub fn vcpu_ioctls() -> Vec<u64> {
    [
        KVM_RUN(),
        KVM_GET_MP_STATE(),
        KVM_SET_MP_STATE(),
        KVM_GET_ONE_REG(),
        KVM_SET_ONE_REG(),
        KVM_IRQ_LINE(),
    ]
    .to_vec()
}

/// Any other thread's: upcall interrupts only (kicks are signals, not ioctls).
pub fn other_ioctls() -> Vec<u64> {
    vec![KVM_IRQ_LINE()]
}
