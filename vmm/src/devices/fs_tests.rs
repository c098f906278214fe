//! Unit tests of the file calls (`fs.rs`) on a host directory.

use std::os::unix::fs::PermissionsExt;

use vmm_sys_util::tempdir::TempDir;

use super::*;
use crate::memory::StackSlots;

const MEM: u64 = 16 << 20;
const PATH: u64 = 0x30_0000;

fn plan() -> Plan {
    let stacks = StackSlots::new(4096, Some(4), MEM).unwrap();
    Plan::new(
        1,
        MEM,
        0x20_0000..0x21_0000,
        0x20_0000,
        16,
        0x20_0000,
        stacks,
    )
    .unwrap()
}

/// The guest cannot make a setuid, setgid or sticky file or directory (found by the `fs`
/// fuzz target: `fs_open` took the mode's bits up to 0o7777).
#[test]
fn guest_modes_are_permission_bits_only() {
    let dir = TempDir::new_with_prefix("/tmp/activm-fs-test").unwrap();
    let files = FileSystem::open(&[MountConfig {
        host: dir.as_path().to_path_buf(),
        guest: "/data".into(),
        read_only: false,
    }])
    .unwrap();
    let (ram, plan) = (GuestRam::new(MEM).unwrap(), plan());
    let mem = GuestMem {
        ram: &ram,
        plan: &plan,
    };
    ram.write_bytes(PATH, b"/data/f\0").unwrap();
    let flags = FS_O_WRONLY | FS_O_CREAT;
    let fd = files
        .call(
            &mem,
            Hypercall::FsOpen,
            [PATH, fs_open_arg(flags, 0o7755), 0, 0],
        )
        .unwrap();
    assert!(fd >= FS_FIRST_FD as i64, "fs_open: {fd}");
    ram.write_bytes(PATH, b"/data/d\0").unwrap();
    let made = files.call(&mem, Hypercall::FsMkdir, [PATH, 0o7777, 0, 0]);
    assert_eq!(made, Ok(0));
    for name in ["f", "d"] {
        let mode = std::fs::metadata(dir.as_path().join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7000, 0, "{name} has mode {mode:o}");
        assert_ne!(mode & 0o700, 0, "{name} keeps its permissions ({mode:o})");
    }
}
