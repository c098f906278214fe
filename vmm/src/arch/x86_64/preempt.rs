//! Testing only (`--preempt-at`, `crate::preempt_at`): stopping a vCPU at a chosen CPL3
//! address on x86_64.
//!
//! KVM's own guest debugging does not stop CPL3 code on our hosts (kvm_pvm: hardware
//! breakpoints and single-step work only at CPL0; a CPL3 `int3` goes to the guest's IDT even
//! with `KVM_GUESTDBG_USE_SW_BP`). So the VMM writes `int3` at the address and puts a hardware
//! breakpoint on the guest's own #BP gate, the stub's vector-3 entry, which runs at CPL0: the
//! vCPU exits to the VMM there (`KVM_EXIT_DEBUG`) before the stub runs an instruction, with
//! the trapped code's registers intact and the CPU's frame on the CPL0 stack. The VMM puts it
//! back at CPL3 on the address from that frame ([`unwind_breakpoint`]).

use kvm_bindings::{kvm_guest_debug, kvm_segment, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_USE_HW_BP};
use kvm_ioctls::{SyncReg, VcpuFd};

use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// The breakpoint instruction written at a preemption point (`int3`).
pub const BREAKPOINT: u8 = 0xCC;

/// The #BP vector.
const VECTOR_BP: u64 = 3;

/// The first instruction the guest runs for a #BP: its IDT gate's target.
pub fn breakpoint_gate(plan: &Plan) -> u64 {
    plan.vectors + VECTOR_BP * plan.vector_stride
}

/// Make the vCPU exit to the VMM when it reaches the #BP gate (hardware breakpoint 0,
/// instruction fetch). Before the vCPU first runs: `KVM_SET_GUEST_DEBUG` is not in the vCPU
/// threads' seccomp list.
pub fn watch_breakpoint_gate(fd: &VcpuFd, gate: u64) -> Result<(), Error> {
    let mut debug = kvm_guest_debug {
        control: KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP,
        ..Default::default()
    };
    debug.arch.debugreg[0] = gate;
    // L0 (local enable of breakpoint 0), R/W0 = 00 (execute), LEN0 = 00, bit 10 reserved 1.
    debug.arch.debugreg[7] = 0x1 | 0x400;
    fd.set_guest_debug(&debug)
        .map_err(Error::kvm("KVM_SET_GUEST_DEBUG"))
}

/// The 64-bit CPL3 code or data segment of selector `selector` (the VMM's GDT: flat, base 0).
fn user_segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 11 } else { 3 },
        present: 1,
        dpl: 3,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        ..Default::default()
    }
}

/// After a debug exit: if the vCPU stands at the #BP gate `gate` with a trap from CPL3, put it
/// back at CPL3 on the `int3` it ran (registers, stack pointer and flags from the CPU's frame on
/// the CPL0 stack; through the synced registers, no ioctl) and return that address. `None`
/// (nothing changed) otherwise.
pub fn unwind_breakpoint(fd: &mut VcpuFd, ram: &GuestRam, gate: u64) -> Option<u64> {
    let sync = fd.sync_regs();
    if sync.regs.rip != gate || sync.sregs.cs.dpl != 0 {
        return None;
    }
    // The CPL0 stack is identity-mapped: rip, cs, rflags, rsp, ss.
    let frame = ram.read_bytes(sync.regs.rsp, 40).ok()?;
    let word = |i: usize| u64::from_le_bytes(frame[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let (rip, cs, rflags, rsp, ss) = (word(0), word(1), word(2), word(3), word(4));
    if cs & 3 != 3 || ss & 3 != 3 {
        return None;
    }
    let addr = rip.wrapping_sub(1);
    let sync = fd.sync_regs_mut();
    sync.regs.rip = addr;
    sync.regs.rsp = rsp;
    sync.regs.rflags = rflags;
    sync.sregs.cs = user_segment(cs as u16, true);
    sync.sregs.ss = user_segment(ss as u16, false);
    fd.set_sync_dirty_reg(SyncReg::Register);
    fd.set_sync_dirty_reg(SyncReg::SystemRegister);
    Some(addr)
}
