//! Where the VMM puts things in the guest-physical address space (aarch64). RAM starts at
//! guest-physical 0 as on x86_64 (`protocol::arch::aarch64`).
//!
//! ```text
//! 0x0000_0000  unmapped (null page)
//! 0x0000_5000  BootInfo                EL0 read-write
//! 0x0000_6000  argument block          EL0 read-write
//! 0x0000_8000  page tables             EL1 only (level 1, four level-2 tables, one level-3
//!                                      table for the first 2 MiB)
//! 0x0001_0000  EL1 stacks, 4 KiB per vCPU   EL1 only
//! 0x0010_0000  level-3 tables of the thread-stack region, then of the boot stacks' blocks
//! 0x0020_0000  guest image: code and read-only data (2 MiB, read-only, executable at EL0 and
//!              EL1), then writable data, the shared area, the EL0 boot stacks (a guard page
//!              under each), the thread-stack region (4 KiB pages, a guard page under every
//!              slot) and the heap, EL0 read-write, never executable
//! 0xF000_0000  GICv3 distributor, then the redistributors: EL0 read-write, device memory
//! 0xFEB0_0000  hypercall page (no memory): EL0 and EL1
//! ```

use protocol::MAX_VCPUS;

pub const BOOT_INFO_ADDR: u64 = 0x5000;
pub const ARGS_ADDR: u64 = 0x6000;
/// The only VMM-written pages below the image the guest may read at EL0 (BootInfo and the
/// argument block): a hypercall buffer below the image must lie here.
pub const USER_LOW: std::ops::Range<u64> =
    BOOT_INFO_ADDR..ARGS_ADDR + protocol::boot::MAX_ARGS_LEN as u64;
/// TTBR0_EL1: level-1 table (39-bit addresses, 1 GiB per entry).
pub const L1_ADDR: u64 = 0x8000;
/// Level-2 tables (2 MiB per entry) for GiB 0..4.
pub const L2_ADDR: u64 = 0x9000;
pub const L2_TABLES: u64 = 4;
/// Level-3 table (4 KiB pages) for the first 2 MiB, where EL1-only and EL0 pages mix.
pub const LOW_L3_ADDR: u64 = L2_ADDR + L2_TABLES * 0x1000;
pub const KERNEL_STACKS_ADDR: u64 = 0x1_0000;
pub const KERNEL_STACK_SIZE: u64 = 4096;
pub const KERNEL_STACKS_END: u64 = KERNEL_STACKS_ADDR + MAX_VCPUS as u64 * KERNEL_STACK_SIZE;

/// Size of each vCPU's EL0 boot stack.
pub const BOOT_STACK_SIZE: u64 = 256 * 1024;
/// The thread-stack region is mapped with 4 KiB pages, one level-3 table per 2 MiB.
pub const STACK_REGION_ALIGN: u64 = 2 << 20;
pub const STACK_TABLES_ADDR: u64 = 0x10_0000;
pub const MAX_STACK_TABLES: u64 = 256;
/// Smallest heap the VMM accepts to leave the guest.
pub const MIN_HEAP: u64 = 1024 * 1024;

/// Top of vCPU `index`'s EL1 stack (SP_EL1).
pub const fn el1_stack_top(index: u64) -> u64 {
    KERNEL_STACKS_ADDR + (index + 1) * KERNEL_STACK_SIZE
}

const _: () = assert!(LOW_L3_ADDR + 0x1000 <= KERNEL_STACKS_ADDR);
const _: () = assert!(ARGS_ADDR + 0x1000 <= L1_ADDR);
const _: () = assert!(KERNEL_STACKS_END <= STACK_TABLES_ADDR);
const _: () =
    assert!(STACK_TABLES_ADDR + MAX_STACK_TABLES * 4096 <= protocol::arch::aarch64::IMAGE_BASE);
const _: () = assert!(L2_TABLES << 30 >= protocol::arch::aarch64::HYPERCALL_BASE + 0x1000);
