//! Boot: the `BootHeader`, the EL1 entry `_start`, and the EL0 entry.
//!
//! Every vCPU enters `_start` at EL1 with the MMU on (the VMM set the translation registers,
//! VBAR_EL1, CPACR_EL1 and CNTKCTL_EL1), x0 = BootInfo, x1 = vCPU index, x2 = top of its EL0
//! stack, SP_EL1 = its EL1 stack. `_start` is 15 instructions: it records the counter, enables
//! the GIC CPU interface (priority mask, group 1), points TPIDRRO_EL0 at the vCPU's
//! [`CpuLocal`](super::percpu::CpuLocal) and `eret`s to EL0 with interrupts on.

use core::mem::{offset_of, size_of};

use protocol::boot::{BootHeader, BootInfo, VcpuBoot, BOOT_HEADER_MAGIC};
use protocol::{Arch, ABI_VERSION, MAX_VCPUS};

use super::percpu::{self, CPU_LOCAL, CPU_LOCAL_SHIFT};

/// log2 of `size_of::<VcpuBoot>()`, to index `BootInfo::vcpus` with a shift.
const VCPU_BOOT_SHIFT: u32 = size_of::<VcpuBoot>().trailing_zeros();

const _: () = {
    assert!(size_of::<BootHeader>() == 64);
    assert!(offset_of!(BootHeader, vectors) == 24);
    assert!(1 << VCPU_BOOT_SHIFT == size_of::<VcpuBoot>());
};

core::arch::global_asm!(
    ".pushsection .activm.header, \"a\"",
    ".balign 8",
    ".globl __activm_boot_header",
    "__activm_boot_header:",
    "    .quad {magic}",
    "    .long {abi_version}",
    "    .long {header_size}",
    "    .long {arch}",
    "    .long 0",
    "    .quad __activm_vectors",
    "    .quad 0",
    "    .quad 0, 0, 0",
    ".popsection",
    "",
    // EL1.
    ".pushsection .text.activm.entry, \"ax\"",
    ".globl _start",
    ".type _start, @function",
    "_start:",
    "    mrs x3, cntvct_el0",
    "    add x4, x0, x1, lsl #{vcpu_boot_shift}",
    "    str x3, [x4, #{first_insn_tsc}]",
    "    mov x4, #0xff",
    "    msr icc_pmr_el1, x4",
    "    mov x4, #1",
    "    msr icc_igrpen1_el1, x4",
    "    adrp x4, {cpu_local}",
    "    add x4, x4, :lo12:{cpu_local}",
    "    add x4, x4, x1, lsl #{cpu_local_shift}",
    "    msr tpidrro_el0, x4",
    "    msr sp_el0, x2",
    "    adrp x4, __activm_user_start",
    "    add x4, x4, :lo12:__activm_user_start",
    "    msr elr_el1, x4",
    "    msr spsr_el1, xzr",
    "    eret",
    ".size _start, . - _start",
    ".popsection",
    "",
    // EL0: x0 = BootInfo, x1 = vCPU index.
    ".pushsection .text.activm.user, \"ax\"",
    "__activm_user_start:",
    "    mov x29, #0",
    "    mov x30, #0",
    "    bl {user_main}",
    "    udf #0",
    ".popsection",
    magic = const BOOT_HEADER_MAGIC,
    abi_version = const ABI_VERSION,
    header_size = const size_of::<BootHeader>(),
    arch = const Arch::Aarch64 as u32,
    vcpu_boot_shift = const VCPU_BOOT_SHIFT,
    first_insn_tsc = const offset_of!(BootInfo, vcpus) + offset_of!(VcpuBoot, first_insn_tsc),
    cpu_local_shift = const CPU_LOCAL_SHIFT,
    cpu_local = sym CPU_LOCAL,
    user_main = sym user_main,
);

/// The first Rust code on every vCPU, at EL0.
///
/// # Safety
/// Called once per vCPU by `__activm_user_start` with the VMM's boot registers.
unsafe extern "C" fn user_main(boot_info: *mut BootInfo, vcpu: u64) -> ! {
    if vcpu >= MAX_VCPUS as u64 {
        crate::hypercall::panic(b"activm-stub: vCPU index out of range");
    }
    if !percpu::init(vcpu as usize) {
        crate::hypercall::panic(b"activm-stub: TPIDRRO_EL0 does not point at this vCPU's block");
    }
    // SAFETY: forwarded from the VMM's boot registers.
    unsafe { crate::start::vcpu_main(boot_info, vcpu as u32) }
}
