//! Guest RAM and the plan of what goes where in it.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::arch::layout::{
    BOOT_STACK_SIZE, MAX_STACK_TABLES, MIN_HEAP, STACK_REGION_ALIGN, STACK_TABLES_ADDR,
};
use crate::error::Error;

/// Guest RAM: one region from guest-physical 0. Every access is bounds-checked, so a hostile
/// guest pointer is an error, never a host fault.
#[derive(Debug)]
pub struct GuestRam {
    mem: GuestMemoryMmap<()>,
    size: u64,
}

impl GuestRam {
    pub fn new(size: u64) -> Result<GuestRam, Error> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size as usize)]).map_err(
            |e| Error::Host(format!("cannot allocate {size} bytes of guest memory: {e}")),
        )?;
        let ram = GuestRam { mem, size };
        ram.advise_huge_pages();
        Ok(ram)
    }

    /// Ask the host for transparent huge pages behind guest RAM: one fault (and one EPT entry)
    /// per 2 MiB instead of per 4 KiB the first time the guest touches its memory. A guest that
    /// creates a million threads touches ~1 GiB of heap; in 4 KiB pages that was most of its
    /// run time, spent in the host kernel. Only advice: a host without THP ignores it.
    fn advise_huge_pages(&self) {
        // SAFETY: the range is exactly the mapping vm-memory made for guest RAM, which lives as
        // long as `self`; MADV_HUGEPAGE changes no contents and no permissions.
        let _ = unsafe {
            libc::madvise(
                self.host_base() as *mut libc::c_void,
                self.size as usize,
                libc::MADV_HUGEPAGE,
            )
        };
    }

    /// Faults in every page of guest RAM now (`--prefault`), writable, in huge pages where the
    /// host gives them: `MADV_POPULATE_WRITE` (Linux 5.14), or one write per 4 KiB page where
    /// the host lacks it. The zeroing the host does for each fresh page is then paid here, at
    /// boot, in proportion to the RAM size, not during the guest's first touches.
    pub fn prefault(&self) -> Result<(), Error> {
        let base = self.host_base() as *mut libc::c_void;
        // SAFETY: the range is exactly guest RAM's mapping, alive as long as `self`; populating
        // changes no contents (the pages are fresh zeroes) and no permissions.
        let done = unsafe { libc::madvise(base, self.size as usize, libc::MADV_POPULATE_WRITE) };
        if done == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(Error::Host(format!("cannot fault in guest RAM: {err}")));
        }
        // An older host: touch each page. Reading and writing back the same byte keeps the
        // contents (guest RAM is fresh and unused at this point anyway).
        for off in (0..self.size).step_by(4096) {
            // SAFETY: `off` lies inside guest RAM's mapping, which is read-write.
            unsafe {
                let p = (base as *mut u8).add(off as usize);
                p.write_volatile(p.read_volatile());
            }
        }
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn inner(&self) -> &GuestMemoryMmap<()> {
        &self.mem
    }

    /// Host address of guest-physical 0 (for KVM_SET_USER_MEMORY_REGION).
    pub fn host_base(&self) -> u64 {
        self.mem
            .get_host_address(GuestAddress(0))
            .map(|p| p as u64)
            .expect("guest RAM starts at 0")
    }

    /// `len` bytes at `gpa`, if they lie inside RAM.
    pub fn read_bytes(&self, gpa: u64, len: u64) -> Result<Vec<u8>, Error> {
        self.check(gpa, len)?;
        let mut buf = vec![0u8; len as usize];
        self.mem
            .read_slice(&mut buf, GuestAddress(gpa))
            .map_err(|e| Error::Memory(format!("read of {len} bytes at {gpa:#x}: {e}")))?;
        Ok(buf)
    }

    pub fn write_bytes(&self, gpa: u64, bytes: &[u8]) -> Result<(), Error> {
        self.check(gpa, bytes.len() as u64)?;
        self.mem
            .write_slice(bytes, GuestAddress(gpa))
            .map_err(|e| Error::Memory(format!("write of {} bytes at {gpa:#x}: {e}", bytes.len())))
    }

    pub fn read_u64(&self, gpa: u64) -> Result<u64, Error> {
        let bytes = self.read_bytes(gpa, 8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    pub fn write_u64(&self, gpa: u64, value: u64) -> Result<(), Error> {
        self.write_bytes(gpa, &value.to_le_bytes())
    }

    pub fn write_u32(&self, gpa: u64, value: u32) -> Result<(), Error> {
        self.write_bytes(gpa, &value.to_le_bytes())
    }

    pub fn write_u16(&self, gpa: u64, value: u16) -> Result<(), Error> {
        self.write_bytes(gpa, &value.to_le_bytes())
    }

    /// Write a plain-data ABI struct.
    ///
    /// `T` must be one of the `protocol` types without implicit padding (every byte is a field
    /// or an explicit `_pad`), which is what the protocol's layout tests pin.
    pub fn write_struct<T: Copy>(&self, gpa: u64, value: &T) -> Result<(), Error> {
        // SAFETY: `value` is a valid, initialised `T` of `size_of::<T>()` bytes; the protocol's
        // ABI types have no implicit padding, so every byte read here is initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts(value as *const T as *const u8, std::mem::size_of::<T>())
        };
        self.write_bytes(gpa, bytes)
    }

    /// Read a plain-data ABI struct (any bit pattern must be a valid `T`: integers only).
    pub fn read_struct<T: Copy + Default>(&self, gpa: u64) -> Result<T, Error> {
        let bytes = self.read_bytes(gpa, std::mem::size_of::<T>() as u64)?;
        let mut value = T::default();
        // SAFETY: `value` is `size_of::<T>()` writable bytes and `T` consists of integers only
        // (the callers use protocol types made of u64/u32 fields), so any byte pattern is valid.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                &mut value as *mut T as *mut u8,
                bytes.len(),
            );
        }
        Ok(value)
    }

    /// The aligned 8-byte word at `gpa` as an atomic shared with the guest (for words both sides
    /// change with read-modify-write operations, such as `BlkSubmitRing::submitted`).
    pub fn atomic_u64(&self, gpa: u64) -> Result<&AtomicU64, Error> {
        self.check(gpa, 8)?;
        if !gpa.is_multiple_of(8) {
            return Err(Error::Memory(format!("{gpa:#x} is not 8-byte aligned")));
        }
        // SAFETY: `gpa..gpa + 8` lies inside the one mapping of guest RAM, which lives (mapped,
        // read-write) as long as `self`, and is 8-byte aligned (the mapping is page aligned).
        // Guest memory is shared with the guest, which may access it at any time: only atomic
        // accesses are made through this reference, and any bit pattern is a valid `AtomicU64`.
        Ok(unsafe { &*((self.host_base() + gpa) as *const AtomicU64) })
    }

    /// The aligned 4-byte word at `gpa` as an atomic shared with the guest.
    pub fn atomic_u32(&self, gpa: u64) -> Result<&AtomicU32, Error> {
        self.check(gpa, 4)?;
        if !gpa.is_multiple_of(4) {
            return Err(Error::Memory(format!("{gpa:#x} is not 4-byte aligned")));
        }
        // SAFETY: as in `atomic_u64`, for 4 aligned bytes inside guest RAM.
        Ok(unsafe { &*((self.host_base() + gpa) as *const AtomicU32) })
    }

    fn check(&self, gpa: u64, len: u64) -> Result<(), Error> {
        match gpa.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::Memory(format!(
                "range {gpa:#x}+{len:#x} lies outside guest RAM (0..{:#x})",
                self.size
            ))),
        }
    }
}

/// What goes where in guest RAM above the image.
#[derive(Clone, Debug)]
pub struct Plan {
    pub nr_vcpus: u32,
    pub mem_size: u64,
    pub image: Range<u64>,
    pub entry: u64,
    /// Interrupt entry stubs (from the boot header).
    pub vectors: u64,
    pub vector_stride: u64,
    pub shared_area: Range<u64>,
    pub boot_stacks: Range<u64>,
    /// Page tables for the thread-stack region (one 4 KiB table per 2 MiB), in VMM memory.
    pub stack_tables: Range<u64>,
    /// Page tables for the 2 MiB pages that hold the boot stacks, in VMM memory after those.
    pub boot_stack_tables: Range<u64>,
    /// Thread stacks with guard pages: `stacks.slots` slots of `stacks.slot_size` bytes.
    pub stack_region: Range<u64>,
    pub stacks: StackSlots,
    pub heap: Range<u64>,
}

/// Usable sizes a guard-paged thread stack may have (`--thread-stack`).
pub const THREAD_STACK_SIZES: std::ops::RangeInclusive<u64> = 4096..=(64 << 20);

/// The thread-stack region the VMM maps with a guard page under every stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSlots {
    /// Bytes per slot, guard page included (a multiple of 4 KiB).
    pub slot_size: u64,
    pub slots: u32,
}

impl StackSlots {
    /// Slots for stacks of `usable` bytes (rounded up to 4 KiB) each; `count` slots, or by
    /// default as many as fit in a quarter of `mem_size` (at most 256 MiB and 4096 slots).
    pub fn new(usable: u64, count: Option<u32>, mem_size: u64) -> Result<StackSlots, Error> {
        if !THREAD_STACK_SIZES.contains(&usable) {
            return Err(Error::Config(
                "--thread-stack must be between 4K and 64M".into(),
            ));
        }
        let slot_size = align_up(usable, 4096) + 4096;
        let slots = match count {
            Some(n) => n,
            None => ((mem_size / 4).min(256 << 20) / slot_size).min(4096) as u32,
        };
        Ok(StackSlots { slot_size, slots })
    }

    pub fn bytes(&self) -> u64 {
        self.slot_size * self.slots as u64
    }
}

/// An unmapped page under every CPL3 boot stack: an overflow faults instead of running into
/// the shared area (vCPU 0) or the next vCPU's stack.
pub const BOOT_STACK_GUARD: u64 = 4096;
/// A boot stack with its guard page below it.
pub const BOOT_STACK_SLOT: u64 = BOOT_STACK_GUARD + BOOT_STACK_SIZE;

const fn align_up(value: u64, align: u64) -> u64 {
    (value + align - 1) & !(align - 1)
}

impl Plan {
    pub fn new(
        nr_vcpus: u32,
        mem_size: u64,
        image: Range<u64>,
        vectors: u64,
        vector_stride: u64,
        entry: u64,
        stacks: StackSlots,
    ) -> Result<Plan, Error> {
        let shared_start = align_up(image.end, 4096);
        let shared_end =
            shared_start + protocol::shared::shared_area_size(nr_vcpus as usize) as u64;
        let stacks_start = align_up(shared_end, 4096);
        let stacks_end = stacks_start + nr_vcpus as u64 * BOOT_STACK_SLOT;
        let region_len = align_up(stacks.bytes(), STACK_REGION_ALIGN);
        let tables = region_len / STACK_REGION_ALIGN;
        if tables > MAX_STACK_TABLES {
            return Err(Error::Config(format!(
                "thread stacks take {} MiB; at most {} MiB are possible (fewer --thread-stacks)",
                region_len >> 20,
                (MAX_STACK_TABLES * STACK_REGION_ALIGN) >> 20
            )));
        }
        // The 2 MiB pages holding the boot stacks are split too, for their guard pages.
        let boot_tables = (align_up(stacks_end, STACK_REGION_ALIGN)
            - (stacks_start & !(STACK_REGION_ALIGN - 1)))
            / STACK_REGION_ALIGN;
        if tables + boot_tables > MAX_STACK_TABLES {
            return Err(Error::Config(format!(
                "thread stacks take {} MiB; at most {} MiB are possible (fewer --thread-stacks)",
                region_len >> 20,
                ((MAX_STACK_TABLES - boot_tables) * STACK_REGION_ALIGN) >> 20
            )));
        }
        let tables_start = STACK_TABLES_ADDR;
        let tables_end = tables_start + tables * 4096;
        let boot_tables_end = tables_end + boot_tables * 4096;
        let region_start = align_up(stacks_end, STACK_REGION_ALIGN);
        let region_end = region_start + region_len;
        let heap_start = align_up(region_end, 4096);
        let needed = heap_start + MIN_HEAP;
        if needed > mem_size {
            return Err(Error::MemTooSmall {
                needed,
                given: mem_size,
            });
        }
        Ok(Plan {
            nr_vcpus,
            mem_size,
            image,
            entry,
            vectors,
            vector_stride,
            shared_area: shared_start..shared_end,
            boot_stacks: stacks_start..stacks_end,
            stack_tables: tables_start..tables_end,
            boot_stack_tables: tables_end..boot_tables_end,
            stack_region: region_start..region_end,
            stacks,
            heap: heap_start..mem_size,
        })
    }

    /// Whether the 4 KiB page at `addr` (inside the thread-stack region) is mapped: every
    /// slot's lowest page is its guard, and the region's tail past the last slot is unmapped.
    pub fn stack_page_mapped(&self, addr: u64) -> bool {
        let offset = addr - self.stack_region.start;
        !offset.is_multiple_of(self.stacks.slot_size) && offset < self.stacks.bytes()
    }

    /// Top of vCPU `index`'s CPL3 boot stack.
    pub fn user_stack_top(&self, index: u32) -> u64 {
        self.boot_stacks.start + (index as u64 + 1) * BOOT_STACK_SLOT
    }

    /// Whether the page at `addr` is the unmapped guard page under a boot stack.
    pub fn is_boot_stack_guard(&self, addr: u64) -> bool {
        self.boot_stacks.contains(&addr)
            && ((addr - self.boot_stacks.start) % BOOT_STACK_SLOT) < BOOT_STACK_GUARD
    }

    /// Guest-physical address of vCPU `index`'s area in the shared area.
    pub fn vcpu_area(&self, index: u32) -> u64 {
        self.shared_area.start + protocol::shared::vcpu_area_offset(index as usize) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn test_stacks() -> StackSlots {
        StackSlots::new(60 * 1024, Some(100), 64 << 20).unwrap()
    }

    #[test]
    fn plan_orders_regions() {
        let plan = Plan::new(
            4,
            64 << 20,
            0x20_0000..0x21_0123,
            0,
            16,
            0x20_0000,
            test_stacks(),
        )
        .unwrap();
        assert_eq!(plan.shared_area.start, 0x21_1000);
        assert!(plan.shared_area.end <= plan.boot_stacks.start);
        assert!(plan.boot_stacks.end <= plan.stack_region.start);
        assert!(plan.stack_tables.end <= 0x20_0000);
        assert_eq!(plan.stack_region.start % STACK_REGION_ALIGN, 0);
        assert!(plan.stack_region.end - plan.stack_region.start >= 100 * 64 * 1024);
        assert!(plan.stack_region.end <= plan.heap.start);
        assert_eq!(plan.heap.end, 64 << 20);
        assert_eq!(plan.user_stack_top(0) % 16, 0);
    }

    #[test]
    fn plan_rejects_small_memory() {
        let err = Plan::new(
            4,
            4 << 20,
            0x20_0000..0x30_0000,
            0,
            16,
            0x20_0000,
            test_stacks(),
        )
        .unwrap_err();
        assert!(matches!(err, Error::MemTooSmall { .. }), "{err}");
    }

    #[test]
    fn stack_slots_default_to_a_quarter_of_ram() {
        let slots = StackSlots::new(124 * 1024, None, 256 << 20).unwrap();
        assert_eq!(slots.slot_size, 128 * 1024);
        assert_eq!(slots.slots, 512);
        assert!(StackSlots::new(100, None, 256 << 20).is_err());
    }

    #[test]
    fn prefault_keeps_guest_ram_contents() {
        let ram = GuestRam::new(4 << 20).unwrap();
        ram.write_u64(0, 7).unwrap();
        ram.write_u64((4 << 20) - 8, 9).unwrap();
        ram.prefault().unwrap();
        assert_eq!(ram.read_u64(0).unwrap(), 7);
        assert_eq!(ram.read_u64((4 << 20) - 8).unwrap(), 9);
        assert_eq!(ram.read_u64(1 << 20).unwrap(), 0);
    }

    #[test]
    fn ram_accesses_are_bounds_checked() {
        let ram = GuestRam::new(1 << 20).unwrap();
        ram.write_u64(8, 42).unwrap();
        assert_eq!(ram.read_u64(8).unwrap(), 42);
        assert!(ram.read_bytes((1 << 20) - 4, 8).is_err());
        assert!(
            ram.read_bytes(u64::MAX - 2, 8).is_err(),
            "overflow is caught"
        );
    }
}
