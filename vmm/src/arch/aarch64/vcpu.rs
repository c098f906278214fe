//! aarch64 vCPU state: initial registers, hypercall arguments, register dumps, user contexts.
//! Every register moves through one `KVM_{GET,SET}_ONE_REG` ioctl ([`super::regs`], counted).

use kvm_ioctls::VcpuFd;

use super::layout::{el1_stack_top, L1_ADDR};
use super::regs::{self, Reg};
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// PSTATE at entry: EL1h with D, A, I, F masked.
const PSTATE_EL1H_MASKED: u64 = 0x3c5;
/// SCTLR_EL1: the RES1 bits, M (MMU), C, I (caches), DZE and UCT (EL0 `dc zva`, CTR_EL0),
/// nTWI and nTWE (EL0 `wfi`/`wfe` not trapped); SPAN (RES1 here) keeps PSTATE.PAN clear so
/// the EL1 stub can write the interrupted EL0 stack.
const SCTLR: u64 =
    0x30D0_0800 | 1 | (1 << 2) | (1 << 12) | (1 << 14) | (1 << 15) | (1 << 16) | (1 << 18);
/// TCR_EL1: T0SZ = 25 (39-bit addresses from level 1), inner/outer write-back walks, inner
/// shareable, 4 KiB granule, no TTBR1 walks (EPD1), 40-bit physical addresses.
const TCR: u64 = 25 | (1 << 8) | (1 << 10) | (3 << 12) | (1 << 23) | (2 << 32);
/// MAIR_EL1: index 0 Device-nGnRE, index 1 normal write-back.
const MAIR: u64 = 0x04 | (0xff << 8);
/// CPACR_EL1.FPEN = 0b11: FP/SIMD at EL0 and EL1 without traps.
const CPACR: u64 = 3 << 20;
/// CNTKCTL_EL1: EL0VCTEN (EL0 reads CNTVCT_EL0) and EL0VTEN (EL0 programs the virtual timer,
/// as x86 CPL3 programs the user-mapped APIC timer).
const CNTKCTL: u64 = (1 << 1) | (1 << 8);

/// Every vCPU starts at once at the image's entry (no PSCI CPU_ON): EL1, MMU on, the VMM's
/// page tables, x0 = BootInfo, x1 = index, x2 = EL0 stack top, SP_EL1 = its EL1 stack. 14
/// `KVM_SET_ONE_REG`s per vCPU.
pub fn configure(fd: &VcpuFd, index: u32, plan: &Plan) -> Result<(), Error> {
    let set: [(Reg, u64); 14] = [
        (regs::MAIR_EL1, MAIR),
        (regs::TCR_EL1, TCR),
        (regs::TTBR0_EL1, L1_ADDR),
        (regs::SCTLR_EL1, SCTLR),
        (regs::CPACR_EL1, CPACR),
        (regs::CNTKCTL_EL1, CNTKCTL),
        (regs::VBAR_EL1, plan.vectors),
        (regs::SP_EL1, el1_stack_top(index as u64)),
        (regs::x(0), super::layout::BOOT_INFO_ADDR),
        (regs::x(1), index as u64),
        (regs::x(2), plan.user_stack_top(index)),
        (regs::PSTATE, PSTATE_EL1H_MASKED),
        (regs::PC, plan.entry),
        // The guest's virtual counter follows the host's (as x86's TSC offset 0), so the
        // boot timestamps compare.
        (regs::TIMER_CNT, super::exit::timestamp()),
    ];
    for (reg, value) in set {
        regs::set(fd, reg, value)?;
    }
    Ok(())
}

/// Exception class names for ESR_EL1.EC.
fn exception_class(ec: u64) -> &'static str {
    match ec {
        0x00 => "unknown reason (undefined instruction?)",
        0x07 => "FP/SIMD access trapped",
        0x15 => "SVC",
        0x18 => "system register access trapped",
        0x20 | 0x21 => "instruction abort",
        0x22 => "PC alignment fault",
        0x24 | 0x25 => "data abort",
        0x26 => "SP alignment fault",
        0x2c => "floating-point exception",
        0x3c => "BRK",
        _ => "other",
    }
}

/// Registers for a report.
pub fn dump(fd: &VcpuFd) -> String {
    let get = |r: Reg| regs::get(fd, r).map_or("?".to_string(), |v| format!("{v:#x}"));
    let mut out = format!(
        "  pc={} sp_el0={} pstate={} elr_el1={} esr_el1={} far_el1={}\n ",
        get(regs::PC),
        get(regs::SP_EL0),
        get(regs::PSTATE),
        get(regs::ELR_EL1),
        get(regs::ESR_EL1),
        get(regs::FAR_EL1),
    );
    for n in 0..31 {
        out += &format!(" x{n}={}", get(regs::x(n)));
        if n % 6 == 5 {
            out += "\n ";
        }
    }
    out
}

/// The `fatal_trap` report: the EL1 stub left the vector offset in x1 and the trapped x0/x1 on
/// its stack; ESR_EL1, ELR_EL1, FAR_EL1 and SPSR_EL1 say what happened.
pub fn fatal_trap_report(fd: &VcpuFd, index: u32, _ram: &GuestRam) -> String {
    let get = |r: Reg| regs::get(fd, r).unwrap_or(0);
    let vector = get(regs::x(1));
    let from = match vector >> 9 {
        0 => "EL1 with SP_EL0",
        1 => "EL1",
        2 => "EL0",
        _ => "EL0 (AArch32)",
    };
    let kind = ["synchronous exception", "IRQ", "FIQ", "SError"][((vector >> 7) & 3) as usize];
    let esr = get(regs::ESR_EL1);
    format!(
        "guest {kind} from {from} on vCPU {index}: {} (ESR_EL1 {esr:#x}) at {:#x}, FAR_EL1 {:#x}, SPSR_EL1 {:#x}\n{}",
        exception_class(esr >> 26),
        get(regs::ELR_EL1),
        get(regs::FAR_EL1),
        get(regs::SPSR_EL1),
        dump(fd)
    )
}
