//! Where the VMM puts things in the guest-physical address space (x86_64).
//!
//! ```text
//! 0x0000_0000  unmapped (null page)
//! 0x0000_1000  GDT                     CPL0 only
//! 0x0000_2000  IDT                     CPL0 only
//! 0x0000_3000  TSS, 128 bytes per vCPU  CPL0 only
//! 0x0000_5000  BootInfo                CPL3 read-write
//! 0x0000_6000  argument block          CPL3 read-write
//! 0x0000_8000  page tables             CPL0 only
//! 0x0001_0000  CPL0 stacks, 8 KiB per vCPU (IST stack, then the RSP0 stack)
//! 0x0010_0000  page tables of the thread-stack region (mapped nowhere)
//! 0x0020_0000  guest image (protocol IMAGE_BASE), then the shared area, the CPL3 boot
//!              stacks, the thread-stack region (4 KiB pages, a guard page under every slot) and the heap;
//!              all CPL3 read-write unless said otherwise
//! 0xFEB0_0000  hypercall page (no memory): CPL3
//! 0xFEE0_0000  local APIC: CPL3, uncached
//! ```

use protocol::MAX_VCPUS;

pub const GDT_ADDR: u64 = 0x1000;
pub const IDT_ADDR: u64 = 0x2000;
pub const TSS_ADDR: u64 = 0x3000;
pub const TSS_STRIDE: u64 = 128;
pub const BOOT_INFO_ADDR: u64 = 0x5000;
pub const ARGS_ADDR: u64 = 0x6000;
/// The only VMM-written pages below the image the guest may read at CPL3 (BootInfo and the
/// argument block): a hypercall buffer below the image must lie here.
pub const USER_LOW: std::ops::Range<u64> =
    BOOT_INFO_ADDR..ARGS_ADDR + protocol::boot::MAX_ARGS_LEN as u64;
pub const PML4_ADDR: u64 = 0x8000;
pub const PDPT_ADDR: u64 = 0x9000;
/// Four page directories covering 0..4 GiB.
pub const PD_ADDR: u64 = 0xA000;
/// 4 KiB page table for the first 2 MiB, so the VMM's structures are not user-visible.
pub const LOW_PT_ADDR: u64 = 0xE000;
pub const KERNEL_STACKS_ADDR: u64 = 0x1_0000;
pub const KERNEL_STACK_SIZE: u64 = 4096;
/// Each vCPU gets an IST stack and an RSP0 stack.
pub const KERNEL_STACKS_PER_VCPU: u64 = 2;
pub const KERNEL_STACKS_END: u64 =
    KERNEL_STACKS_ADDR + MAX_VCPUS as u64 * KERNEL_STACKS_PER_VCPU * KERNEL_STACK_SIZE;

/// Size of each vCPU's CPL3 boot stack.
pub const BOOT_STACK_SIZE: u64 = 256 * 1024;
/// The thread-stack region is mapped with 4 KiB pages, one page table per 2 MiB.
pub const STACK_REGION_ALIGN: u64 = 2 << 20;
/// Where those page tables go, and how many fit (so the region is at most 512 MiB).
pub const STACK_TABLES_ADDR: u64 = 0x10_0000;
pub const MAX_STACK_TABLES: u64 = 256;
/// Smallest heap the VMM accepts to leave the guest.
pub const MIN_HEAP: u64 = 1024 * 1024;

/// Top of vCPU `index`'s RSP0 stack (CPL0 entry from CPL3).
pub const fn rsp0_top(index: u64) -> u64 {
    KERNEL_STACKS_ADDR + (index * KERNEL_STACKS_PER_VCPU + 2) * KERNEL_STACK_SIZE
}

/// Top of vCPU `index`'s IST stack (NMI, double fault, machine check).
pub const fn ist_top(index: u64) -> u64 {
    KERNEL_STACKS_ADDR + (index * KERNEL_STACKS_PER_VCPU + 1) * KERNEL_STACK_SIZE
}

const _: () = assert!(KERNEL_STACKS_END <= STACK_TABLES_ADDR);
const _: () =
    assert!(STACK_TABLES_ADDR + MAX_STACK_TABLES * 4096 <= protocol::arch::x86_64::IMAGE_BASE);
const _: () = assert!(TSS_ADDR + MAX_VCPUS as u64 * TSS_STRIDE <= BOOT_INFO_ADDR);
const _: () = assert!(LOW_PT_ADDR + 0x1000 <= KERNEL_STACKS_ADDR);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_stacks_do_not_overlap() {
        for i in 0..MAX_VCPUS as u64 {
            assert!(ist_top(i) < rsp0_top(i));
            if i > 0 {
                assert!(rsp0_top(i - 1) <= ist_top(i) - KERNEL_STACK_SIZE);
            }
        }
        assert_eq!(rsp0_top(MAX_VCPUS as u64 - 1), KERNEL_STACKS_END);
    }

    #[test]
    fn gdt_holds_every_tss() {
        let gdt_bytes = protocol::arch::x86_64::TSS_SELECTOR_BASE as u64 + 16 * MAX_VCPUS as u64;
        assert!(gdt_bytes <= IDT_ADDR - GDT_ADDR);
    }
}
