//! Building the aarch64 boot structures in guest memory: the stage-1 page tables (4 KiB
//! granule, 39-bit addresses, identity map). Attribute index 0 is device memory, 1 normal
//! write-back memory (`MAIR_EL1`, set in `vcpu.rs`).

use protocol::arch::aarch64::{
    GICD_BASE, GICR_BASE, GICR_STRIDE, HYPERCALL_BASE, IMAGE_BASE, IMAGE_DATA_BASE,
};
use protocol::boot::MemKind;

use super::layout::*;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

const TWO_MIB: u64 = 2 << 20;
/// Descriptor types: level 1/2 table, level 1/2 block, level 3 page.
const TABLE: u64 = 0b11;
const BLOCK: u64 = 0b01;
const PAGE: u64 = 0b11;
const ATTR_DEVICE: u64 = 0 << 2;
const ATTR_NORMAL: u64 = 1 << 2;
/// AP[2:1]: EL1 read-write only; EL1 and EL0 read-write; EL1 and EL0 read-only.
const AP_EL1_RW: u64 = 0b00 << 6;
const AP_EL0_RW: u64 = 0b01 << 6;
const AP_EL0_RO: u64 = 0b11 << 6;
const INNER_SHAREABLE: u64 = 0b11 << 8;
const ACCESS_FLAG: u64 = 1 << 10;
const PXN: u64 = 1 << 53;
const UXN: u64 = 1 << 54;

/// EL0 read-write data: never executable.
const EL0_DATA: u64 = ATTR_NORMAL | AP_EL0_RW | INNER_SHAREABLE | ACCESS_FLAG | PXN | UXN;
/// EL1-only data (page tables, EL1 stacks).
const EL1_DATA: u64 = ATTR_NORMAL | AP_EL1_RW | INNER_SHAREABLE | ACCESS_FLAG | PXN | UXN;
/// The image's code block: read-only, executable at both levels.
const CODE: u64 = ATTR_NORMAL | AP_EL0_RO | INNER_SHAREABLE | ACCESS_FLAG;
/// Device registers and the hypercall page.
const DEVICE: u64 = ATTR_DEVICE | AP_EL0_RW | ACCESS_FLAG | PXN | UXN;

/// Where the VMM's own structures sit, for the guest's memory map.
pub fn vmm_regions() -> [(u64, u64, MemKind); 4] {
    [
        (BOOT_INFO_ADDR, 0x2000, MemKind::BootInfo),
        (L1_ADDR, KERNEL_STACKS_END - L1_ADDR, MemKind::Vmm),
        (GICD_BASE, 0x1_0000, MemKind::InterruptController),
        (GICR_BASE, GICR_STRIDE, MemKind::InterruptController),
    ]
}

/// Write the page tables.
pub fn write_tables(ram: &GuestRam, plan: &Plan) -> Result<(), Error> {
    let l2 = |gib: u64| L2_ADDR + 0x1000 * gib;
    for gib in 0..L2_TABLES {
        ram.write_u64(L1_ADDR + 8 * gib, l2(gib) | TABLE)?;
    }
    // RAM: 2 MiB blocks; the first through a level-3 table.
    ram.write_u64(l2(0), LOW_L3_ADDR | TABLE)?;
    let mut low = [0u8; 4096];
    for (page, entry) in low.chunks_exact_mut(8).enumerate() {
        let addr = 4096 * page as u64;
        let attrs = match addr {
            BOOT_INFO_ADDR | ARGS_ADDR => EL0_DATA,
            a if (L1_ADDR..KERNEL_STACKS_END).contains(&a) => EL1_DATA,
            _ => continue,
        };
        entry.copy_from_slice(&(addr | attrs | PAGE).to_le_bytes());
    }
    ram.write_bytes(LOW_L3_ADDR, &low)?;
    for block in (TWO_MIB..plan.mem_size).step_by(TWO_MIB as usize) {
        let attrs = ram_block_attrs(block);
        ram.write_u64(
            l2(block >> 30) + 8 * ((block >> 21) & 511),
            block | attrs | BLOCK,
        )?;
    }
    // The interrupt controller (every redistributor) and the hypercall page.
    let gic_end = GICR_BASE + protocol::MAX_VCPUS as u64 * GICR_STRIDE;
    for block in (GICD_BASE & !(TWO_MIB - 1)..gic_end).step_by(TWO_MIB as usize) {
        ram.write_u64(
            l2(block >> 30) + 8 * ((block >> 21) & 511),
            block | DEVICE | BLOCK,
        )?;
    }
    let hc = HYPERCALL_BASE & !(TWO_MIB - 1);
    ram.write_u64(l2(hc >> 30) + 8 * ((hc >> 21) & 511), hc | DEVICE | BLOCK)?;
    write_stack_region_tables(ram, plan, &l2)?;
    write_boot_stack_tables(ram, plan, &l2)
}

/// EL0 attributes of the RAM block at `block` (2 MiB aligned).
fn ram_block_attrs(block: u64) -> u64 {
    if (IMAGE_BASE..IMAGE_DATA_BASE).contains(&block) {
        CODE
    } else {
        EL0_DATA
    }
}

/// Map the 2 MiB blocks that hold the EL0 boot stacks with 4 KiB pages, as before but for the
/// guard page under every stack, which stays unmapped (an overflow faults instead of running
/// into the shared area or the next vCPU's stack).
fn write_boot_stack_tables(
    ram: &GuestRam,
    plan: &Plan,
    l2: &impl Fn(u64) -> u64,
) -> Result<(), Error> {
    let first = plan.boot_stacks.start & !(TWO_MIB - 1);
    for (i, chunk) in (first..plan.boot_stacks.end)
        .step_by(TWO_MIB as usize)
        .enumerate()
    {
        let table = plan.boot_stack_tables.start + 4096 * i as u64;
        debug_assert!(table < plan.boot_stack_tables.end);
        ram.write_u64(l2(chunk >> 30) + 8 * ((chunk >> 21) & 511), table | TABLE)?;
        let attrs = ram_block_attrs(chunk);
        let mut entries = [0u8; 4096];
        for (page, entry) in entries.chunks_exact_mut(8).enumerate() {
            let addr = chunk + 4096 * page as u64;
            if addr < plan.mem_size && !plan.is_boot_stack_guard(addr) {
                entry.copy_from_slice(&(addr | attrs | PAGE).to_le_bytes());
            }
        }
        ram.write_bytes(table, &entries)?;
    }
    Ok(())
}

/// Map the thread-stack region with 4 KiB pages, leaving the lowest page of every slot unmapped.
fn write_stack_region_tables(
    ram: &GuestRam,
    plan: &Plan,
    l2: &impl Fn(u64) -> u64,
) -> Result<(), Error> {
    let region = &plan.stack_region;
    for (i, chunk) in (region.start..region.end)
        .step_by(TWO_MIB as usize)
        .enumerate()
    {
        let table = plan.stack_tables.start + 4096 * i as u64;
        ram.write_u64(l2(chunk >> 30) + 8 * ((chunk >> 21) & 511), table | TABLE)?;
        let mut entries = [0u8; 4096];
        for (page, entry) in entries.chunks_exact_mut(8).enumerate() {
            let addr = chunk + 4096 * page as u64;
            if plan.stack_page_mapped(addr) {
                entry.copy_from_slice(&(addr | EL0_DATA | PAGE).to_le_bytes());
            }
        }
        ram.write_bytes(table, &entries)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_and_thread_stacks_have_guard_pages() {
        let stacks = crate::memory::StackSlots::new(60 * 1024, Some(40), 64 << 20).unwrap();
        let plan = Plan::new(
            2,
            64 << 20,
            IMAGE_BASE..IMAGE_DATA_BASE + 0x1_0000,
            0,
            0,
            IMAGE_BASE,
            stacks,
        )
        .unwrap();
        let ram = GuestRam::new(plan.mem_size).unwrap();
        write_tables(&ram, &plan).unwrap();
        let pte = |addr: u64| {
            let l2 = ram.read_u64(L1_ADDR + 8 * (addr >> 30)).unwrap() & !0xfff;
            let l2e = ram.read_u64(l2 + 8 * ((addr >> 21) & 511)).unwrap();
            assert_eq!(l2e & 3, TABLE, "4 KiB pages at {addr:#x}");
            ram.read_u64((l2e & 0xf_ffff_f000) + 8 * ((addr >> 12) & 511))
                .unwrap()
        };
        for vcpu in 0..plan.nr_vcpus {
            let top = plan.user_stack_top(vcpu);
            let bottom = top - BOOT_STACK_SIZE;
            assert_eq!(pte(top - 4096), (top - 4096) | EL0_DATA | PAGE);
            assert_eq!(pte(bottom), bottom | EL0_DATA | PAGE);
            assert_eq!(
                pte(bottom - 4096),
                0,
                "guard under the stack of vCPU {vcpu}"
            );
        }
        let shared_last = plan.shared_area.end - 4096;
        assert_eq!(pte(shared_last), shared_last | EL0_DATA | PAGE);
        let start = plan.stack_region.start;
        assert_eq!(pte(start), 0, "guard of thread-stack slot 0");
        assert_eq!(pte(start + 4096), (start + 4096) | EL0_DATA | PAGE);
    }
}
