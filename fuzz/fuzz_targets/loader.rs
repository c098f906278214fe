//! The ELF loader and the boot-header checks: any file is inspected, and loaded into guest RAM
//! when inspection accepts it. What inspection accepts must lie in RAM above the image base.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use activm::loader::{inspect, load};
use activm_fuzz::{scratch_dir, Guest, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::arch::x86_64::IMAGE_BASE;

fuzz_target!(|data: &[u8]| {
    static WORLD: OnceLock<(Guest, PathBuf)> = OnceLock::new();
    let (guest, path) = WORLD.get_or_init(|| (Guest::new(1), scratch_dir().join("image.elf")));
    std::fs::write(path, data).expect("write the image");
    let Ok(info) = inspect(path, MEM_SIZE) else {
        return;
    };
    assert!(info.span.start >= IMAGE_BASE && info.span.end <= MEM_SIZE);
    assert!(info.span.contains(&info.entry));
    let _ = load(path, &info, &guest.ram);
});
