//! Register access through `KVM_GET_ONE_REG` / `KVM_SET_ONE_REG` (arm64 has neither
//! `KVM_GET_REGS` nor `kvm_run` sync_regs), counted: every transfer is one vCPU ioctl.

use std::sync::atomic::{AtomicU64, Ordering};

use kvm_ioctls::VcpuFd;

use crate::error::Error;

/// `KVM_REG_ARM64 | KVM_REG_SIZE_U64`.
const ARM64_U64: u64 = 0x6030_0000_0000_0000;
const ARM64_U128: u64 = 0x6040_0000_0000_0000;
const ARM64_U32: u64 = 0x6020_0000_0000_0000;
/// `KVM_REG_ARM_CORE`: an offset into `struct kvm_regs`, in 32-bit words.
const CORE: u64 = 0x0010 << 16;
/// `KVM_REG_ARM64_SYSREG`.
const SYSREG: u64 = 0x0013 << 16;

/// Offsets in `struct kvm_regs` (arm64): `regs[31], sp, pc, pstate`, then `sp_el1`, `elr_el1`,
/// `spsr[5]`, then the FP/SIMD state (`vregs[32]`, `fpsr`, `fpcr`) 16-byte aligned.
const OFF_SP: u64 = 31 * 8;
const OFF_PC: u64 = 32 * 8;
const OFF_PSTATE: u64 = 33 * 8;
const OFF_SP_EL1: u64 = 34 * 8;
const OFF_VREGS: u64 = 42 * 8;
const OFF_FPSR: u64 = OFF_VREGS + 32 * 16;
const OFF_FPCR: u64 = OFF_FPSR + 4;

/// A register id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(pub u64);

impl Reg {
    /// Size in bytes (the id's size field: 2 = 32 bits, 3 = 64 bits, 4 = 128 bits).
    fn size(self) -> usize {
        1 << ((self.0 >> 52) & 0xf)
    }
}

pub const fn x(n: u64) -> Reg {
    Reg(ARM64_U64 | CORE | (n * 8 / 4))
}
pub const SP_EL0: Reg = Reg(ARM64_U64 | CORE | (OFF_SP / 4));
pub const PC: Reg = Reg(ARM64_U64 | CORE | (OFF_PC / 4));
pub const PSTATE: Reg = Reg(ARM64_U64 | CORE | (OFF_PSTATE / 4));
pub const SP_EL1: Reg = Reg(ARM64_U64 | CORE | (OFF_SP_EL1 / 4));
pub const fn v(n: u64) -> Reg {
    Reg(ARM64_U128 | CORE | ((OFF_VREGS + 16 * n) / 4))
}
pub const FPSR: Reg = Reg(ARM64_U32 | CORE | (OFF_FPSR / 4));
pub const FPCR: Reg = Reg(ARM64_U32 | CORE | (OFF_FPCR / 4));

const fn sys(op0: u64, op1: u64, crn: u64, crm: u64, op2: u64) -> Reg {
    Reg(ARM64_U64 | SYSREG | (op0 << 14) | (op1 << 11) | (crn << 7) | (crm << 3) | op2)
}
pub const SCTLR_EL1: Reg = sys(3, 0, 1, 0, 0);
pub const CPACR_EL1: Reg = sys(3, 0, 1, 0, 2);
pub const TTBR0_EL1: Reg = sys(3, 0, 2, 0, 0);
pub const TCR_EL1: Reg = sys(3, 0, 2, 0, 2);
pub const ESR_EL1: Reg = sys(3, 0, 5, 2, 0);
pub const FAR_EL1: Reg = sys(3, 0, 6, 0, 0);
pub const MAIR_EL1: Reg = sys(3, 0, 10, 2, 0);
pub const VBAR_EL1: Reg = sys(3, 0, 12, 0, 0);
pub const ELR_EL1: Reg = Reg(ARM64_U64 | CORE | (35 * 8 / 4));
pub const SPSR_EL1: Reg = Reg(ARM64_U64 | CORE | (36 * 8 / 4));
pub const CNTKCTL_EL1: Reg = sys(3, 0, 14, 1, 0);
pub const TPIDR_EL0: Reg = sys(3, 3, 13, 0, 2);
pub const TPIDRRO_EL0: Reg = sys(3, 3, 13, 0, 3);
/// `KVM_REG_ARM_TIMER_CNT`: the guest's virtual counter (KVM's encoding, not the sysreg's).
pub const TIMER_CNT: Reg = sys(3, 3, 14, 3, 2);

/// Register transfers since start: (gets, sets), over every vCPU.
static GETS: AtomicU64 = AtomicU64::new(0);
static SETS: AtomicU64 = AtomicU64::new(0);

/// `(KVM_GET_ONE_REG count, KVM_SET_ONE_REG count)` so far.
pub fn transfers() -> (u64, u64) {
    (GETS.load(Ordering::Relaxed), SETS.load(Ordering::Relaxed))
}

pub fn get(fd: &VcpuFd, reg: Reg) -> Result<u64, Error> {
    GETS.fetch_add(1, Ordering::Relaxed);
    let mut data = [0u8; 8];
    fd.get_one_reg(reg.0, &mut data[..reg.size()])
        .map_err(Error::kvm("KVM_GET_ONE_REG"))?;
    Ok(u64::from_le_bytes(data))
}

pub fn get_u128(fd: &VcpuFd, reg: Reg) -> Result<u128, Error> {
    GETS.fetch_add(1, Ordering::Relaxed);
    let mut data = [0u8; 16];
    fd.get_one_reg(reg.0, &mut data)
        .map_err(Error::kvm("KVM_GET_ONE_REG"))?;
    Ok(u128::from_le_bytes(data))
}

pub fn set(fd: &VcpuFd, reg: Reg, value: u64) -> Result<(), Error> {
    SETS.fetch_add(1, Ordering::Relaxed);
    let bytes = value.to_le_bytes();
    fd.set_one_reg(reg.0, &bytes[..reg.size()])
        .map(|_| ())
        .map_err(Error::kvm("KVM_SET_ONE_REG"))
}
