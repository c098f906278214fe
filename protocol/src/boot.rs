//! Boot: the header every guest image carries, and the information the VMM hands each vCPU.
//!
//! **Image.** A guest is a static ELF64 linked at or above the architecture's `IMAGE_BASE`. Its
//! lowest loadable address holds a [`BootHeader`] (the linker script puts section
//! `.activm.header` first). The VMM checks the magic, the ABI version and the architecture before
//! it runs anything.
//!
//! **Entry (x86_64).** Every vCPU starts at the ELF entry point at CPL0 in 64-bit mode, with
//! paging, GDT, TSS and IDT set up by the VMM, interrupts off, and
//! `rdi` = guest-physical address of [`BootInfo`], `rsi` = vCPU index,
//! `rdx` = top of this vCPU's CPL3 stack, `rsp` = top of its CPL0 stack.
//! Memory is identity-mapped (virtual = physical).

use crate::wire::wire_enum;
use crate::MAX_VCPUS;

/// `BootHeader::magic`: "ACTIVMHD".
pub const BOOT_HEADER_MAGIC: u64 = u64::from_le_bytes(*b"ACTIVMHD");
/// `BootInfo::magic`: "ACTIVMBI".
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"ACTIVMBI");

/// Carried by the guest image at its lowest loadable address.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BootHeader {
    /// [`BOOT_HEADER_MAGIC`].
    pub magic: u64,
    /// [`crate::ABI_VERSION`] the guest was built against.
    pub abi_version: u32,
    /// `size_of::<BootHeader>()`.
    pub header_size: u32,
    /// [`crate::Arch`] as u32.
    pub arch: u32,
    /// Reserved, zero.
    pub flags: u32,
    /// x86_64: address of 256 interrupt entry stubs, one every `vector_stride` bytes, which the
    /// VMM writes into the IDT. aarch64: the exception vector table (VBAR_EL1).
    pub vectors: u64,
    /// x86_64: distance between two entry stubs. aarch64: zero.
    pub vector_stride: u64,
    /// Reserved, zero.
    pub reserved: [u64; 3],
}

impl BootHeader {
    pub const fn new(arch: crate::Arch, vectors: u64, vector_stride: u64) -> BootHeader {
        BootHeader {
            magic: BOOT_HEADER_MAGIC,
            abi_version: crate::ABI_VERSION,
            header_size: core::mem::size_of::<BootHeader>() as u32,
            arch: arch as u32,
            flags: 0,
            vectors,
            vector_stride,
            reserved: [0; 3],
        }
    }
}

wire_enum! {
    /// What a region of the guest-physical address space holds.
    pub enum MemKind: u32 {
        /// Tables the VMM built (GDT, IDT, TSS, page tables) and CPL0 stacks: not mapped for CPL3.
        Vmm = 1 => "vmm",
        /// This [`BootInfo`] and the argument strings.
        BootInfo = 2 => "boot info",
        /// The loaded guest image.
        Image = 3 => "image",
        /// The activation shared area ([`crate::shared`]).
        SharedArea = 4 => "shared area",
        /// The per-vCPU CPL3 boot stacks.
        BootStacks = 5 => "boot stacks",
        /// Free RAM: the guest's heap.
        Free = 6 => "free",
        /// The hypercall page (no memory behind it).
        Hypercall = 7 => "hypercall",
        /// The interrupt controller (x86_64: the local APIC page, mapped for CPL3).
        InterruptController = 8 => "interrupt controller",
        /// Thread stacks with guard pages (`BootInfo::stack_region`).
        ThreadStacks = 9 => "thread stacks",
    }
}

/// One entry of the memory map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    pub start: u64,
    pub size: u64,
    /// [`MemKind`] as u32.
    pub kind: u32,
    pub _pad: u32,
}

impl MemRegion {
    pub const EMPTY: MemRegion = MemRegion {
        start: 0,
        size: 0,
        kind: 0,
        _pad: 0,
    };
}

/// The largest number of memory-map entries.
pub const MAX_MEM_REGIONS: usize = 16;

/// Per-vCPU boot data.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VcpuBoot {
    /// Top of this vCPU's CPL3 boot stack (also passed in a register at entry).
    pub user_stack_top: u64,
    /// Written by the guest: TSC at its first instruction on this vCPU.
    pub first_insn_tsc: u64,
    /// Written by the guest: TSC when this vCPU reached the guest's main code.
    pub main_tsc: u64,
    /// The interrupt controller's id for this vCPU (x86_64: APIC id).
    pub irq_id: u32,
    pub _pad: u32,
}

impl VcpuBoot {
    pub const EMPTY: VcpuBoot = VcpuBoot {
        user_stack_top: 0,
        first_insn_tsc: 0,
        main_tsc: 0,
        irq_id: 0,
        _pad: 0,
    };
}

/// `BootInfo::flags`: the user asked for `--boot-timing`.
pub const BOOT_FLAG_TIMING: u32 = 1 << 0;
/// `BootInfo::flags`: `wall_clock_ns` and `wall_clock_tsc` are valid.
pub const BOOT_FLAG_WALL_CLOCK: u32 = 1 << 1;
/// `BootInfo::flags`: `env`, `env_len` and `envc` are valid.
pub const BOOT_FLAG_ENV: u32 = 1 << 2;
/// `BootInfo::flags`: `entropy_seed` holds 32 bytes from the host's `getrandom(2)`.
pub const BOOT_FLAG_ENTROPY: u32 = 1 << 3;

/// Written by the VMM before the guest starts; the guest writes only the `VcpuBoot` timestamps.
/// Lives in one page, mapped read-write for CPL3; the argument block follows in the next page.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`crate::ABI_VERSION`] of the VMM.
    pub abi_version: u32,
    /// `size_of::<BootInfo>()`.
    pub size: u32,
    /// Number of vCPUs the guest was started with.
    pub nr_vcpus: u32,
    /// `BOOT_FLAG_*`.
    pub flags: u32,
    /// TSC frequency in kHz (guest and host TSC agree).
    pub tsc_khz: u64,
    /// Host TSC when the VMM process started (for `--boot-timing`).
    pub vmm_start_tsc: u64,
    /// Bytes of RAM, from guest-physical 0.
    pub mem_size: u64,
    /// Guest-physical address of the hypercall page.
    pub hypercall_base: u64,
    /// Guest-physical address of the interrupt controller (x86_64: local APIC).
    pub irq_controller_base: u64,
    /// The activation shared area: address and size.
    pub shared_area: u64,
    pub shared_area_size: u64,
    /// Free RAM for the guest's heap: `[heap_start, heap_end)`.
    pub heap_start: u64,
    pub heap_end: u64,
    /// Guest arguments: `argc` NUL-terminated UTF-8 strings packed at `args`, `args_len` bytes.
    pub args: u64,
    pub args_len: u32,
    pub argc: u32,
    /// Valid entries of `mem_map`.
    pub nr_mem_regions: u32,
    pub _pad: u32,
    pub mem_map: [MemRegion; MAX_MEM_REGIONS],
    pub vcpus: [VcpuBoot; MAX_VCPUS],
    /// Thread stacks with guard pages, mapped by the VMM with 4 KiB pages: `nr_stack_slots`
    /// slots of `stack_slot_size` bytes from `stack_region`. The lowest page of every slot is
    /// left unmapped (the guard); the stack grows down from the slot's end.
    pub stack_region: u64,
    pub stack_slot_size: u64,
    pub nr_stack_slots: u32,
    pub _pad2: u32,
    // Appended without an ABI bump (see [`crate::ABI_VERSION`]): a guest reads each group below
    // only if its `BOOT_FLAG_*` bit is set, so a VMM that predates them still boots it.
    /// [`BOOT_FLAG_WALL_CLOCK`]: the host's `CLOCK_REALTIME`, in nanoseconds since the UNIX
    /// epoch, when the guest's counter (x86_64: TSC; aarch64: CNTVCT_EL0) read `wall_clock_tsc`.
    pub wall_clock_ns: u64,
    pub wall_clock_tsc: u64,
    /// [`BOOT_FLAG_ENV`]: the guest environment: `envc` NUL-terminated `KEY=VALUE` UTF-8 strings
    /// packed at `env`, `env_len` bytes. It follows the arguments in the argument block; the two
    /// together take at most [`MAX_ARGS_LEN`] bytes.
    pub env: u64,
    pub env_len: u32,
    pub envc: u32,
    /// [`BOOT_FLAG_ENTROPY`]: a seed for the guest's random generator, fresh from the host
    /// for each guest at each start. The guest's stub moves it out of this page at boot and
    /// zeroes it here.
    pub entropy_seed: [u8; 32],
}

impl BootInfo {
    /// Whether the VMM set `flag` (a `BOOT_FLAG_*`) in a `BootInfo` long enough to hold the
    /// fields the flag announces (a VMM that predates them sets neither).
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0 && self.size as usize >= core::mem::size_of::<BootInfo>()
    }
}

/// The largest argument block (arguments and environment together).
pub const MAX_ARGS_LEN: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn boot_header_layout() {
        assert_eq!(size_of::<BootHeader>(), 64);
        assert_eq!(offset_of!(BootHeader, abi_version), 8);
        assert_eq!(offset_of!(BootHeader, arch), 16);
        assert_eq!(offset_of!(BootHeader, vectors), 24);
        assert_eq!(offset_of!(BootHeader, vector_stride), 32);
        assert_eq!(BOOT_HEADER_MAGIC.to_le_bytes(), *b"ACTIVMHD");
    }

    #[test]
    fn boot_info_layout() {
        assert_eq!(size_of::<MemRegion>(), 24);
        assert_eq!(size_of::<VcpuBoot>(), 32);
        assert_eq!(offset_of!(BootInfo, nr_vcpus), 16);
        assert_eq!(offset_of!(BootInfo, tsc_khz), 24);
        assert_eq!(offset_of!(BootInfo, vmm_start_tsc), 32);
        assert_eq!(offset_of!(BootInfo, mem_size), 40);
        assert_eq!(offset_of!(BootInfo, hypercall_base), 48);
        assert_eq!(offset_of!(BootInfo, irq_controller_base), 56);
        assert_eq!(offset_of!(BootInfo, shared_area), 64);
        assert_eq!(offset_of!(BootInfo, heap_start), 80);
        assert_eq!(offset_of!(BootInfo, args), 96);
        assert_eq!(offset_of!(BootInfo, args_len), 104);
        assert_eq!(offset_of!(BootInfo, argc), 108);
        assert_eq!(offset_of!(BootInfo, nr_mem_regions), 112);
        assert_eq!(offset_of!(BootInfo, mem_map), 120);
        assert_eq!(offset_of!(BootInfo, vcpus), 120 + 24 * MAX_MEM_REGIONS);
        assert_eq!(
            offset_of!(BootInfo, stack_region),
            504 + 32 * crate::MAX_VCPUS
        );
        assert_eq!(offset_of!(BootInfo, stack_slot_size), 2560);
        assert_eq!(offset_of!(BootInfo, nr_stack_slots), 2568);
        assert_eq!(offset_of!(BootInfo, wall_clock_ns), 2576);
        assert_eq!(offset_of!(BootInfo, wall_clock_tsc), 2584);
        assert_eq!(offset_of!(BootInfo, env), 2592);
        assert_eq!(offset_of!(BootInfo, env_len), 2600);
        assert_eq!(offset_of!(BootInfo, envc), 2604);
        assert_eq!(offset_of!(BootInfo, entropy_seed), 2608);
        assert_eq!(size_of::<BootInfo>(), 2640);
        assert!(size_of::<BootInfo>() <= 4096, "BootInfo must fit one page");
    }
}
