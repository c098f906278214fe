//! What the seccomp filters need to know about x86_64: the target, and the KVM ioctl requests
//! each thread kind makes once the guests are set up.

use kvm_bindings::{
    kvm_lapic_state, kvm_mp_state, kvm_msi, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xsave, KVMIO,
};
use seccompiler::TargetArch;

pub const TARGET: TargetArch = TargetArch::x86_64;
/// The pre-`*at` calls x86_64 still has (other architectures: repeat the `*at` call).
pub const LEGACY_OPEN: libc::c_long = libc::SYS_open;
pub const LEGACY_UNLINK: libc::c_long = libc::SYS_unlink;

vmm_sys_util::ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_mp_state);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
vmm_sys_util::ioctl_iow_nr!(KVM_SIGNAL_MSI, KVMIO, 0xa5, kvm_msi);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_XSAVE2, KVMIO, 0xcf, kvm_xsave);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);

/// A vCPU thread's: run, halt state, the FP state of a preempted context, register and
/// interrupt-controller dumps for fault reports, upcall interrupts.
pub fn vcpu_ioctls() -> Vec<u64> {
    [
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_GET_MP_STATE(),
        KVM_SET_MP_STATE(),
        KVM_GET_XSAVE(),
        KVM_GET_XSAVE2(),
        KVM_SIGNAL_MSI(),
        KVM_GET_LAPIC(),
        KVM_GET_VCPU_EVENTS(),
    ]
    .to_vec()
}

/// Any other thread's: upcall interrupts only (kicks are signals, not ioctls).
pub fn other_ioctls() -> Vec<u64> {
    vec![KVM_SIGNAL_MSI()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_match_the_kernel_headers() {
        assert_eq!(KVM_RUN(), 0xae80);
        assert_eq!(KVM_GET_REGS(), 0x8090_ae81);
        assert_eq!(KVM_SET_MP_STATE(), 0x4004_ae99);
        assert_eq!(KVM_SIGNAL_MSI(), 0x4020_aea5);
        assert_eq!(KVM_GET_XSAVE(), 0x9000_aea4);
    }
}
