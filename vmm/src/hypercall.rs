//! Hypercall dispatch: a load from the hypercall page, arguments in registers
//! (see `protocol::hypercall`). Every argument is untrusted.

use kvm_bindings::{kvm_mp_state, kvm_regs, KVM_MP_STATE_HALTED};
use kvm_ioctls::VcpuFd;
use protocol::hypercall::{decode, Hypercall, HC_UNSUPPORTED, MAX_WRITE_LEN};

use crate::arch::current::abi::HYPERCALL_BASE;
use crate::arch::current::vcpu::{dump, fatal_trap_report, hypercall_args};
use crate::vm::{Outcome, VmShared};

/// What the vCPU loop does after an exit.
#[derive(Debug)]
pub enum HcAction {
    Continue,
    /// This vCPU is done; the guest goes on.
    StopVcpu,
    /// The whole guest is done.
    Finish(Outcome),
}

fn violation(index: u32, fd: &VcpuFd, what: String) -> HcAction {
    HcAction::Finish(Outcome::fault(index, format!("{what}\n{}", dump(fd))))
}

/// Handle an MMIO load at `addr`; `Ok(value)` is the load's result.
pub fn handle_load(
    fd: &VcpuFd,
    index: u32,
    vm: &VmShared,
    addr: u64,
    len: usize,
    regs: &kvm_regs,
) -> Result<u64, HcAction> {
    let nr = match decode(addr, HYPERCALL_BASE) {
        None => {
            return Err(violation(index, fd, format!(
                "vCPU {index} read unbacked guest-physical address {addr:#x} (rip {:#x}): no device there",
                regs.rip
            )))
        }
        Some(Err(offset)) => {
            return Err(violation(index, fd, format!(
                "malformed hypercall on vCPU {index}: load at hypercall-page offset {offset:#x} is not 8-byte aligned"
            )))
        }
        Some(Ok(nr)) => nr,
    };
    if len != 8 {
        return Err(violation(index, fd, format!(
            "malformed hypercall {nr} on vCPU {index}: a {len}-byte load (hypercalls are 8-byte loads)"
        )));
    }
    let Some(call) = Hypercall::from_raw(nr) else {
        return Err(violation(
            index,
            fd,
            format!(
                "unknown hypercall {nr} on vCPU {index} (rip {:#x})",
                regs.rip
            ),
        ));
    };
    let [a0, a1, _a2, _a3] = hypercall_args(regs);
    match call {
        Hypercall::ConsoleWrite => {
            let bytes = read_buffer(vm, call, a0, a1).map_err(|e| violation(index, fd, e))?;
            vm.console_write(&bytes);
            Ok(a1)
        }
        Hypercall::Exit => Err(HcAction::Finish(Outcome::Exited((a0 & 0xff) as i32))),
        Hypercall::Panic => {
            let message = match read_buffer(vm, call, a0, a1) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => format!("<unreadable panic message: {e}>"),
            };
            Err(HcAction::Finish(Outcome::Panicked {
                vcpu: index,
                message,
            }))
        }
        Hypercall::FatalTrap => Err(HcAction::Finish(Outcome::Fault {
            vcpu: index,
            report: fatal_trap_report(fd, index, &vm.ram, regs),
        })),
        Hypercall::VcpuStop => Err(HcAction::StopVcpu),
        Hypercall::Halt => {
            // Sleep inside KVM until an interrupt is pending; KVM completes this load first.
            fd.set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_HALTED,
            })
            .map_err(|e| violation(index, fd, format!("KVM_SET_MP_STATE(HALTED): {e}")))?;
            Ok(0)
        }
        Hypercall::SaRegister
        | Hypercall::SaSetConcurrency
        | Hypercall::SaYield
        | Hypercall::SaPreempt
        | Hypercall::SaEnable => Ok(HC_UNSUPPORTED),
    }
}

fn read_buffer(vm: &VmShared, call: Hypercall, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
    if len > MAX_WRITE_LEN {
        return Err(format!(
            "malformed hypercall {}: length {len} exceeds the limit of {MAX_WRITE_LEN}",
            call.name()
        ));
    }
    vm.ram.read_bytes(gpa, len).map_err(|e| {
        format!(
            "malformed hypercall {}: buffer {gpa:#x}+{len}: {e}",
            call.name()
        )
    })
}

/// Describe a store that exited to the VMM.
pub fn describe_store(_vm: &VmShared, addr: u64, len: usize) -> String {
    match decode(addr, HYPERCALL_BASE) {
        Some(_) => format!(
            "malformed hypercall: a {len}-byte store to the hypercall page at {addr:#x} (hypercalls are loads)"
        ),
        None => format!("{len}-byte store to unbacked guest-physical address {addr:#x}: no device there"),
    }
}
