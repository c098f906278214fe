//! Building the x86_64 boot structures in guest memory: GDT, TSS, IDT, page tables.

use protocol::arch::x86_64::{
    vector_has_error_code, HYPERCALL_BASE, IST_CRITICAL, KERNEL_CS, LAPIC_BASE, TSS_SELECTOR_BASE,
};
use protocol::boot::MemKind;

use super::layout::*;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_WRITE_THROUGH: u64 = 1 << 3;
const PTE_NO_CACHE: u64 = 1 << 4;
const PTE_HUGE: u64 = 1 << 7;
const TWO_MIB: u64 = 2 << 20;

/// Where the VMM's own structures sit, for the guest's memory map.
pub fn vmm_regions() -> [(u64, u64, MemKind); 4] {
    [
        (GDT_ADDR, BOOT_INFO_ADDR - GDT_ADDR, MemKind::Vmm),
        (BOOT_INFO_ADDR, 0x2000, MemKind::BootInfo),
        (PML4_ADDR, KERNEL_STACKS_END - PML4_ADDR, MemKind::Vmm),
        (LAPIC_BASE, 0x1000, MemKind::InterruptController),
    ]
}

/// Write GDT, TSSs, IDT and page tables.
pub fn write_tables(ram: &GuestRam, plan: &Plan) -> Result<(), Error> {
    write_gdt(ram, plan.nr_vcpus)?;
    write_idt(ram, plan.vectors, plan.vector_stride)?;
    write_page_tables(ram, plan.mem_size)?;
    write_stack_region_tables(ram, plan)?;
    write_boot_stack_tables(ram, plan)
}

/// Map the 2 MiB pages that hold the CPL3 boot stacks with 4 KiB pages, as before but for the
/// guard page under every stack, which stays unmapped.
fn write_boot_stack_tables(ram: &GuestRam, plan: &Plan) -> Result<(), Error> {
    let user = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    let first = plan.boot_stacks.start & !(TWO_MIB - 1);
    for (i, chunk) in (first..plan.boot_stacks.end)
        .step_by(TWO_MIB as usize)
        .enumerate()
    {
        let table = plan.boot_stack_tables.start + 4096 * i as u64;
        debug_assert!(table < plan.boot_stack_tables.end);
        ram.write_u64(PD_ADDR + 8 * (chunk / TWO_MIB), table | user)?;
        let mut entries = [0u8; 4096];
        for (page, entry) in entries.chunks_exact_mut(8).enumerate() {
            let addr = chunk + 4096 * page as u64;
            if addr < plan.mem_size && !plan.is_boot_stack_guard(addr) {
                entry.copy_from_slice(&(addr | user).to_le_bytes());
            }
        }
        ram.write_bytes(table, &entries)?;
    }
    Ok(())
}

/// Map the thread-stack region with 4 KiB pages, leaving the lowest page of every slot unmapped.
/// The tables live in the VMM's low memory, mapped nowhere. Built before any vCPU runs, so no TLB holds the 2 MiB
/// mappings this replaces.
fn write_stack_region_tables(ram: &GuestRam, plan: &Plan) -> Result<(), Error> {
    let user = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    let region = &plan.stack_region;
    for (i, chunk) in (region.start..region.end)
        .step_by(TWO_MIB as usize)
        .enumerate()
    {
        let table = plan.stack_tables.start + 4096 * i as u64;
        ram.write_u64(PD_ADDR + 8 * (chunk / TWO_MIB), table | user)?;
        // One write per table: 512 entries.
        let mut entries = [0u8; 4096];
        for (page, entry) in entries.chunks_exact_mut(8).enumerate() {
            let addr = chunk + 4096 * page as u64;
            if plan.stack_page_mapped(addr) {
                entry.copy_from_slice(&(addr | user).to_le_bytes());
            }
        }
        ram.write_bytes(table, &entries)?;
    }
    Ok(())
}

fn write_gdt(ram: &GuestRam, nr_vcpus: u32) -> Result<(), Error> {
    // Accessed bits pre-set so the CPU never needs to write the descriptors.
    let fixed: [u64; 5] = [
        0,
        0x0020_9B00_0000_0000, // 0x08 kernel code: P, DPL0, code, L
        0x00CF_9300_0000_FFFF, // 0x10 kernel data: P, DPL0, data, writable
        0x00CF_F300_0000_FFFF, // 0x18 user data: P, DPL3
        0x0020_FB00_0000_0000, // 0x20 user code: P, DPL3, L
    ];
    for (i, desc) in fixed.iter().enumerate() {
        ram.write_u64(GDT_ADDR + 8 * i as u64, *desc)?;
    }
    for i in 0..nr_vcpus as u64 {
        let base = TSS_ADDR + i * TSS_STRIDE;
        let limit = 0x67u64;
        // 64-bit TSS, busy (it is loaded through KVM_SET_SREGS as already busy).
        let low = (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (0x8Bu64 << 40)
            | (((base >> 24) & 0xff) << 56);
        let sel = TSS_SELECTOR_BASE as u64 + 16 * i;
        ram.write_u64(GDT_ADDR + sel, low)?;
        ram.write_u64(GDT_ADDR + sel + 8, base >> 32)?;
        // TSS: RSP0 at 4, IST1 at 0x24, I/O map base beyond the limit (no I/O bitmap).
        ram.write_u64(base + 4, rsp0_top(i))?;
        ram.write_u64(base + 0x24 + 8 * (IST_CRITICAL as u64 - 1), ist_top(i))?;
        ram.write_u16(base + 0x66, 0x68)?;
    }
    Ok(())
}

/// GDT limit for `nr_vcpus` TSS descriptors.
pub fn gdt_limit(nr_vcpus: u32) -> u16 {
    (TSS_SELECTOR_BASE as u32 + 16 * nr_vcpus - 1) as u16
}

fn write_idt(ram: &GuestRam, vectors: u64, stride: u64) -> Result<(), Error> {
    for vector in 0..256u64 {
        let handler = vectors + vector * stride;
        let ist = match vector {
            2 | 8 | 18 => IST_CRITICAL as u64,
            _ => 0,
        };
        // Interrupt gate (type 0xE), present, DPL0: `int n` from CPL3 faults.
        let low = (handler & 0xffff)
            | ((KERNEL_CS as u64) << 16)
            | (ist << 32)
            | (0x8Eu64 << 40)
            | (((handler >> 16) & 0xffff) << 48);
        ram.write_u64(IDT_ADDR + 16 * vector, low)?;
        ram.write_u64(IDT_ADDR + 16 * vector + 8, handler >> 32)?;
    }
    debug_assert!(vector_has_error_code(14));
    Ok(())
}

fn write_page_tables(ram: &GuestRam, mem_size: u64) -> Result<(), Error> {
    let table = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    ram.write_u64(PML4_ADDR, PDPT_ADDR | table)?;
    for gib in 0..4u64 {
        ram.write_u64(PDPT_ADDR + 8 * gib, (PD_ADDR + 0x1000 * gib) | table)?;
    }
    // First 2 MiB in 4 KiB pages: page 0 stays unmapped, VMM structures are CPL0-only.
    ram.write_u64(PD_ADDR, LOW_PT_ADDR | table)?;
    let kernel = PTE_PRESENT | PTE_WRITABLE;
    let user = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    let low = |start: u64, end: u64, flags: u64| -> Result<(), Error> {
        let mut page = start;
        while page < end {
            ram.write_u64(LOW_PT_ADDR + 8 * (page >> 12), page | flags)?;
            page += 0x1000;
        }
        Ok(())
    };
    low(GDT_ADDR, BOOT_INFO_ADDR, kernel)?;
    low(BOOT_INFO_ADDR, ARGS_ADDR + 0x1000, user)?;
    low(PML4_ADDR, LOW_PT_ADDR + 0x1000, kernel)?;
    low(KERNEL_STACKS_ADDR, KERNEL_STACKS_END, kernel)?;
    // RAM above 2 MiB in 2 MiB pages, all CPL3 read-write.
    let mut addr = TWO_MIB;
    while addr < mem_size {
        ram.write_u64(PD_ADDR + 8 * (addr / TWO_MIB), addr | user | PTE_HUGE)?;
        addr += TWO_MIB;
    }
    // The hypercall page and the local APIC, uncached, reachable from CPL3.
    for mmio in [HYPERCALL_BASE, LAPIC_BASE] {
        let page = mmio & !(TWO_MIB - 1);
        let flags = user | PTE_HUGE | PTE_NO_CACHE | PTE_WRITE_THROUGH;
        ram.write_u64(PD_ADDR + 8 * (page / TWO_MIB), page | flags)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        let stacks = crate::memory::StackSlots::new(60 * 1024, Some(40), 64 << 20).unwrap();
        Plan::new(
            2,
            64 << 20,
            0x20_0000..0x30_0000,
            0x20_0100,
            16,
            0x20_0000,
            stacks,
        )
        .unwrap()
    }

    #[test]
    fn thread_stacks_have_guard_pages() {
        let plan = plan();
        let ram = GuestRam::new(plan.mem_size).unwrap();
        write_tables(&ram, &plan).unwrap();
        let start = plan.stack_region.start;
        let pde = ram.read_u64(PD_ADDR + 8 * (start / TWO_MIB)).unwrap();
        assert_eq!(pde & PTE_HUGE, 0, "4 KiB pages in the stack region");
        let table = pde & !0xfff;
        let pte = |addr: u64| ram.read_u64(table + 8 * ((addr - start) / 4096)).unwrap();
        let slot = plan.stacks.slot_size;
        assert_eq!(pte(start), 0, "guard of slot 0");
        assert_eq!(pte(start + 4096), (start + 4096) | 7);
        assert_eq!(pte(start + slot), 0, "guard of slot 1");
        assert_eq!(pte(start + slot - 4096), (start + slot - 4096) | 7);
    }

    #[test]
    fn boot_stacks_have_guard_pages() {
        let plan = plan();
        let ram = GuestRam::new(plan.mem_size).unwrap();
        write_tables(&ram, &plan).unwrap();
        let pte = |addr: u64| {
            let pde = ram.read_u64(PD_ADDR + 8 * (addr / TWO_MIB)).unwrap();
            assert_eq!(pde & PTE_HUGE, 0, "4 KiB pages around the boot stacks");
            ram.read_u64((pde & !0xfff) + 8 * ((addr % TWO_MIB) / 4096))
                .unwrap()
        };
        for vcpu in 0..plan.nr_vcpus {
            let top = plan.user_stack_top(vcpu);
            let bottom = top - BOOT_STACK_SIZE;
            assert_eq!(pte(top - 4096), (top - 4096) | 7, "stack of vCPU {vcpu}");
            assert_eq!(pte(bottom), bottom | 7);
            assert_eq!(
                pte(bottom - 4096),
                0,
                "guard under the stack of vCPU {vcpu}"
            );
        }
        // vCPU 0's guard page lies between the shared area and its stack.
        let guard = plan.user_stack_top(0) - BOOT_STACK_SIZE - 4096;
        assert!(guard >= plan.shared_area.end);
        assert_eq!(
            pte(plan.shared_area.end - 4096),
            (plan.shared_area.end - 4096) | 7
        );
        assert_eq!(pte(plan.image.start), plan.image.start | 7);
    }

    #[test]
    fn page_tables_hide_vmm_structures() {
        let plan = plan();
        let ram = GuestRam::new(plan.mem_size).unwrap();
        write_tables(&ram, &plan).unwrap();
        let pte = |addr: u64| ram.read_u64(LOW_PT_ADDR + 8 * (addr >> 12)).unwrap();
        assert_eq!(pte(0), 0, "null page unmapped");
        assert_eq!(pte(GDT_ADDR) & PTE_USER, 0);
        assert_eq!(pte(IDT_ADDR) & PTE_USER, 0);
        assert_ne!(pte(BOOT_INFO_ADDR) & PTE_USER, 0);
        assert_eq!(pte(KERNEL_STACKS_ADDR) & PTE_USER, 0);
        let pde = |addr: u64| ram.read_u64(PD_ADDR + 8 * (addr / TWO_MIB)).unwrap();
        assert_eq!(
            pde(plan.heap.end - TWO_MIB),
            (plan.heap.end - TWO_MIB) | 0x87
        );
        assert_eq!(pde(64 << 20), 0, "nothing mapped past RAM");
        assert_ne!(pde(HYPERCALL_BASE) & PTE_NO_CACHE, 0);
    }

    #[test]
    fn idt_gate_points_at_stub() {
        let plan = plan();
        let ram = GuestRam::new(plan.mem_size).unwrap();
        write_tables(&ram, &plan).unwrap();
        let low = ram.read_u64(IDT_ADDR + 16 * 14).unwrap();
        let high = ram.read_u64(IDT_ADDR + 16 * 14 + 8).unwrap();
        let handler = (low & 0xffff) | ((low >> 48) << 16) | (high << 32);
        assert_eq!(handler, 0x20_0100 + 14 * 16);
        assert_eq!((low >> 16) & 0xffff, KERNEL_CS as u64);
        let df = ram.read_u64(IDT_ADDR + 16 * 8).unwrap();
        assert_eq!((df >> 32) & 7, IST_CRITICAL as u64);
    }
}
