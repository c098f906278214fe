//! Boot: the `BootHeader`, the CPL0 entry `_start`, and the CPL3 entry.
//!
//! `_start` runs at CPL0 (emulated, ~0.4 us per instruction) and is 19 instructions: it records
//! the TSC, points IA32_GS_BASE at this vCPU's [`CpuLocal`](super::percpu::CpuLocal) and
//! `iretq`s to CPL3 with interrupts on. Everything else runs at CPL3.

use core::mem::{offset_of, size_of};

use protocol::arch::x86_64::{USER_CS, USER_DS};
use protocol::boot::{BootHeader, BootInfo, VcpuBoot, BOOT_HEADER_MAGIC};
use protocol::{Arch, ABI_VERSION, MAX_VCPUS};

use super::percpu::{self, CPU_LOCAL, CPU_LOCAL_SHIFT};

/// IA32_GS_BASE.
const MSR_GS_BASE: u32 = 0xC000_0101;
/// RFLAGS at CPL3 entry: IF and the always-one bit 1.
const USER_RFLAGS: u64 = 0x202;
/// `BootHeader::vector_stride`: build.rs places one stub every 16 bytes.
const VECTOR_STRIDE: u64 = 16;
/// log2 of `size_of::<VcpuBoot>()`, to index `BootInfo::vcpus` with a shift.
const VCPU_BOOT_SHIFT: u32 = size_of::<VcpuBoot>().trailing_zeros();

// The header below is written field by field in assembly (its `vectors` is a link-time address);
// pin the layout it assumes.
const _: () = {
    assert!(size_of::<BootHeader>() == 64);
    assert!(offset_of!(BootHeader, magic) == 0);
    assert!(offset_of!(BootHeader, abi_version) == 8);
    assert!(offset_of!(BootHeader, header_size) == 12);
    assert!(offset_of!(BootHeader, arch) == 16);
    assert!(offset_of!(BootHeader, flags) == 20);
    assert!(offset_of!(BootHeader, vectors) == 24);
    assert!(offset_of!(BootHeader, vector_stride) == 32);
    assert!(offset_of!(BootHeader, reserved) == 40);
    assert!(1 << VCPU_BOOT_SHIFT == size_of::<VcpuBoot>());
};

core::arch::global_asm!(
    // BootHeader, the first bytes of the image (link.ld puts .activm.header first).
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
    "    .quad {stride}",
    "    .quad 0, 0, 0",
    ".popsection",
    "",
    // CPL0. rdi = &BootInfo, rsi = vCPU index, rdx = top of the CPL3 stack.
    ".pushsection .text.activm.entry, \"ax\"",
    ".globl _start",
    ".type _start, @function",
    "_start:",
    "    mov %rdx, %r8",
    "    rdtsc",
    "    shl $32, %rdx",
    "    or %rdx, %rax",
    "    mov %rsi, %rcx",
    "    shl ${vcpu_boot_shift}, %rcx",
    "    mov %rax, {first_insn_tsc}(%rdi, %rcx)",
    // IA32_GS_BASE = &CPU_LOCAL[vcpu] (below 4 GiB: edx = 0).
    "    mov %esi, %eax",
    "    shl ${cpu_local_shift}, %eax",
    "    add ${cpu_local}, %eax",
    "    xor %edx, %edx",
    "    mov ${msr_gs_base}, %ecx",
    "    wrmsr",
    // To CPL3 at __activm_user_start, rdi and rsi unchanged.
    "    pushq ${user_ds}",
    "    pushq %r8",
    "    pushq ${user_rflags}",
    "    pushq ${user_cs}",
    "    pushq $__activm_user_start",
    "    iretq",
    ".size _start, . - _start",
    ".popsection",
    "",
    // CPL3: align the stack for the C ABI and enter Rust.
    ".pushsection .text.activm.user, \"ax\"",
    "__activm_user_start:",
    "    xor %ebp, %ebp",
    "    and $-16, %rsp",
    "    call {user_main}",
    "    ud2",
    ".popsection",
    magic = const BOOT_HEADER_MAGIC,
    abi_version = const ABI_VERSION,
    header_size = const size_of::<BootHeader>(),
    arch = const Arch::X86_64 as u32,
    stride = const VECTOR_STRIDE,
    vcpu_boot_shift = const VCPU_BOOT_SHIFT,
    first_insn_tsc = const offset_of!(BootInfo, vcpus) + offset_of!(VcpuBoot, first_insn_tsc),
    cpu_local_shift = const CPU_LOCAL_SHIFT,
    cpu_local = sym CPU_LOCAL,
    msr_gs_base = const MSR_GS_BASE,
    user_ds = const USER_DS,
    user_rflags = const USER_RFLAGS,
    user_cs = const USER_CS,
    user_main = sym user_main,
    options(att_syntax),
);

/// The first Rust code on every vCPU, at CPL3.
///
/// # Safety
/// Called once per vCPU by `__activm_user_start` with the VMM's boot registers.
unsafe extern "C" fn user_main(boot_info: *mut BootInfo, vcpu: u64) -> ! {
    if vcpu >= MAX_VCPUS as u64 {
        crate::hypercall::panic(b"activm-stub: vCPU index out of range");
    }
    if !percpu::init(vcpu as usize) {
        crate::hypercall::panic(
            b"activm-stub: %gs does not point at this vCPU's block (wrmsr IA32_GS_BASE failed?)",
        );
    }
    // SAFETY: forwarded from the VMM's boot registers.
    unsafe { crate::start::vcpu_main(boot_info, vcpu as u32) }
}
