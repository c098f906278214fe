//! What the fuzz targets share: a guest's RAM and memory plan without a VM, and disk images in a
//! temporary directory.

use std::path::{Path, PathBuf};

use activm::memory::{GuestRam, Plan, StackSlots};
use protocol::arch::x86_64::IMAGE_BASE;

/// Guest RAM of every target: small, so whole-RAM checks stay cheap.
pub const MEM_SIZE: u64 = 16 << 20;
/// The guest image's span in the plan.
pub const IMAGE_LEN: u64 = 0x1_0000;

/// A guest without a VM: its RAM and the plan of what lies where in it.
#[derive(Debug)]
pub struct Guest {
    pub ram: GuestRam,
    pub plan: Plan,
}

impl Guest {
    pub fn new(nr_vcpus: u32) -> Guest {
        let stacks = StackSlots::new(4096, Some(4), MEM_SIZE).expect("stack slots");
        let image = IMAGE_BASE..IMAGE_BASE + IMAGE_LEN;
        let plan = Plan::new(
            nr_vcpus, MEM_SIZE, image, IMAGE_BASE, 16, IMAGE_BASE, stacks,
        )
        .expect("a plan fits in MEM_SIZE");
        let ram = GuestRam::new(MEM_SIZE).expect("guest RAM");
        Guest { ram, plan }
    }
}

/// A directory of this process for files a target makes (disk images, ELF files), on tmpfs
/// when there is one.
pub fn scratch_dir() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("activm-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Reads fields from the fuzzer's bytes; zeros once they run out.
#[derive(Debug)]
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        self.u32() as u64 | (self.u32() as u64) << 32
    }

    /// A value that is often small or near a boundary: the byte picks the kind.
    pub fn number(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u8() as u64,
            1 => self.u32() as u64,
            2 => u64::MAX - self.u8() as u64,
            _ => self.u64(),
        }
    }
}
