//! The std guests' file calls (`devices/fs.rs`, `devices/fs_path.rs`) as a hostile guest makes
//! them: any call number and arguments, paths the fuzzer spells in guest RAM (`..`, `//`,
//! symbolic links leading out, host paths, no NUL, the end of RAM), a sequence of calls per
//! input, against a real host tree made once per process: a read-write mount at `/data`, a
//! read-only one at `/data/ro`, and beside them an `outside` directory holding a canary.
//!
//! Oracles: no panic; every value is `>= 0` or a `-errno`; no file the guest opens or stats
//! lies outside the mounts (its inode is never the canary's, `outside`'s or a parent's); after
//! every input `outside`, the canary, the read-only mount and the mounts' parent are unchanged,
//! no setuid or setgid file was made, no host descriptor is left open, and guest RAM below the
//! image is untouched. Each input gets a fresh descriptor table, and the read-write mount is
//! remade after any input that may have changed it, so every input runs on the same tree.

#![no_main]

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use activm::config::MountConfig;
use activm::devices::fs::{FileSystem, GuestMem};
use activm_fuzz::{scratch_dir, Guest, Input, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::fs::*;
use protocol::hypercall::Hypercall;

/// Guest RAM: 8 path slots, the buffers, one `FsStat` the oracle reads back.
const PATHS: u64 = 0x30_0000;
const PATH_SLOT: u64 = 0x2000;
const BUFS: u64 = 0x40_0000;
const ORACLE_STAT: u64 = 0x3f_0000;
/// Guest RAM just below the image, which no call may write.
const LOW_GUARD: u64 = 4096;
const STEPS: usize = 48;

/// Path pieces the fuzzer strings together (besides raw bytes).
const PIECES: &[&[u8]] = &[
    b"/data",
    b"/data/",
    b"/data/ro",
    b"/",
    b"..",
    b".",
    b"//",
    b"/..",
    b"sub",
    b"f",
    b"a.txt",
    b"up",
    b"updir",
    b"canlink",
    b"abs",
    b"root",
    b"etc",
    b"dangling",
    b"deep",
    b"selfloop",
    b"inner",
    b"fifo",
    b"outside",
    b"canary",
    b"new",
    b"r.txt",
    b"back",
    b"rsub",
    b"/ro",
];

struct World {
    guest: Guest,
    /// The read-write mount's host directory.
    mount: PathBuf,
    configs: Vec<MountConfig>,
    /// Host paths whose state must not change: the outside directory, the canary, the
    /// read-only mount and its file, the mounts' parent.
    watched: Vec<(PathBuf, Snapshot)>,
    canary: PathBuf,
    /// Inodes no guest call may reach: outside, the canary, the mounts' parent and above.
    forbidden: Vec<u64>,
    dev: u64,
    /// The lowest free host descriptor between inputs.
    free_fd: i32,
}

#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    ino: u64,
    mode: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn snapshot(path: &Path) -> Snapshot {
    let m = std::fs::symlink_metadata(path).expect("a watched path");
    Snapshot {
        ino: m.ino(),
        mode: m.mode(),
        nlink: m.nlink(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

const CANARY: &[u8] = b"the outside canary: never read, written or removed by a guest\n";

/// The read-write mount's tree in its (empty) directory: files, a directory, a FIFO, links in
/// and out.
fn make_mount(mount: &Path, outside: &Path) {
    std::fs::write(mount.join("a.txt"), b"hello from the mount\n").expect("a.txt");
    std::fs::create_dir(mount.join("sub")).expect("sub");
    std::fs::write(mount.join("sub/f"), vec![b'x'; 5000]).expect("sub/f");
    let links: &[(&str, &Path)] = &[
        ("up", Path::new("..")),
        ("updir", Path::new("../outside")),
        ("canlink", Path::new("../outside/canary")),
        ("dangling", Path::new("../outside/new")),
        ("sub/deep", Path::new("../../outside")),
        ("selfloop", Path::new("selfloop")),
        ("inner", Path::new("sub/f")),
        ("root", Path::new("/")),
        ("etc", Path::new("/etc/passwd")),
    ];
    for (name, target) in links {
        symlink(target, mount.join(name)).expect("symlink");
    }
    symlink(outside.join("canary"), mount.join("abs")).expect("abs");
    let fifo = std::ffi::CString::new(mount.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
}

/// Lowest free descriptor number.
fn lowest_free_fd() -> i32 {
    // SAFETY: duplicates stdin's descriptor (or fails) and closes the copy at once.
    let fd = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 0) };
    assert!(fd >= 0, "F_DUPFD");
    // SAFETY: `fd` is the copy just made.
    unsafe { libc::close(fd) };
    fd
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let scratch = scratch_dir();
        let top = scratch.join("fs");
        let (mount, ro, outside) = (top.join("mount"), top.join("ro"), top.join("outside"));
        let _ = std::fs::remove_dir_all(&top);
        for d in [&top, &outside, &ro] {
            std::fs::create_dir(d).expect("scratch tree");
        }
        std::fs::write(outside.join("canary"), CANARY).expect("canary");
        std::fs::write(ro.join("r.txt"), b"read only\n").expect("r.txt");
        std::fs::create_dir(ro.join("rsub")).expect("rsub");
        symlink("../mount", ro.join("back")).expect("back");
        std::fs::create_dir(&mount).expect("mount");
        make_mount(&mount, &outside);
        let canary = outside.join("canary");
        let watched: Vec<PathBuf> = vec![
            outside.clone(),
            canary.clone(),
            top.clone(),
            ro.clone(),
            ro.join("r.txt"),
            ro.join("rsub"),
        ];
        let forbidden = [&outside, &canary, &top, &scratch, &scratch.join("..")]
            .iter()
            .map(|p| std::fs::metadata(p).expect("forbidden").ino())
            .collect();
        let guest = Guest::new(1);
        let image = guest.plan.image.start;
        guest
            .ram
            .write_bytes(image - LOW_GUARD, &[0xa5; LOW_GUARD as usize])
            .expect("guard");
        let cfg = |host: &Path, guest: &str, read_only| MountConfig {
            host: host.to_path_buf(),
            guest: guest.into(),
            read_only,
        };
        World {
            guest,
            dev: std::fs::metadata(&top).expect("top").dev(),
            configs: vec![cfg(&mount, "/data", false), cfg(&ro, "/data/ro", true)],
            mount,
            watched: watched
                .into_iter()
                .map(|p| {
                    let s = snapshot(&p);
                    (p, s)
                })
                .collect(),
            canary,
            forbidden,
            free_fd: lowest_free_fd(),
        }
    })
}

/// Write a path the fuzzer spells into slot `slot`: pieces, raw bytes, then a NUL, or none.
fn set_path(world: &World, input: &mut Input, slot: u64) {
    let mut path = Vec::new();
    for _ in 0..input.u8() % 12 {
        match input.u8() {
            b @ 0..=0xbf => path.extend_from_slice(PIECES[b as usize % PIECES.len()]),
            0xc0..=0xef => path.push(input.u8()),
            0xf0..=0xf7 => path.extend_from_slice(world.mount.as_os_str().as_encoded_bytes()),
            _ => path.extend_from_slice(world.canary.as_os_str().as_encoded_bytes()),
        }
    }
    match input.u8() % 16 {
        // No NUL within the limit.
        0 => path.resize(FS_PATH_MAX as usize + 8, b'a'),
        // Exactly the limit with no room for the NUL.
        1 => path.resize(FS_PATH_MAX as usize, b'/'),
        _ => path.push(0),
    }
    path.truncate(PATH_SLOT as usize);
    let _ = world.guest.ram.write_bytes(PATHS + slot * PATH_SLOT, &path);
}

/// An argument: a path slot, a buffer, a descriptor, open flags, a length, or anything.
fn arg(world: &World, input: &mut Input, last_fd: u64) -> u64 {
    match input.u8() % 12 {
        0 | 1 => PATHS + (input.u8() as u64 % 8) * PATH_SLOT,
        2 => BUFS + input.u32() as u64 % (2 << 20),
        3 => FS_FIRST_FD + input.u8() as u64 % 8,
        4 => last_fd,
        5 => {
            let bits = input.u8() as u32;
            let mut flags = bits & FS_O_ACCMODE;
            for (i, f) in [
                FS_O_CREAT,
                FS_O_EXCL,
                FS_O_TRUNC,
                FS_O_APPEND,
                FS_O_DIRECTORY,
            ]
            .into_iter()
            .enumerate()
            {
                if bits & (4 << i) != 0 {
                    flags |= f;
                }
            }
            fs_open_arg(flags, input.u32() & 0o7777)
        }
        6 => input.u8() as u64,
        7 => MEM_SIZE - input.u8() as u64,
        8 => input.u32() as u64 % (FS_MAX_IO + 2),
        9 => input.u32() as u64 % world.guest.plan.image.start,
        10 => (input.u8() as u64) << 12,
        _ => input.number(),
    }
}

/// A file the guest reached (by `fs_stat` or `fs_fstat` at `gpa`) must lie in a mount.
fn check_stat(world: &World, gpa: u64, what: &str) {
    let st: FsStat = world.guest.ram.read_struct(gpa).expect("stat in RAM");
    let outside = st.dev == world.dev && world.forbidden.contains(&st.ino);
    assert!(
        !outside,
        "{what} reached inode {} outside the mounts",
        st.ino
    );
    assert!(
        st.mode & libc::S_IFMT == libc::S_IFLNK || st.dev == world.dev,
        "{what} reached another filesystem (dev {:#x})",
        st.dev
    );
}

/// Which calls may change the read-write mount.
fn may_change(kind: Hypercall, a: &[u64; 4], value: i64) -> bool {
    match kind {
        Hypercall::FsOpen => a[1] as u32 & (FS_O_CREAT | FS_O_TRUNC) != 0,
        Hypercall::FsWrite | Hypercall::FsMkdir | Hypercall::FsUnlink | Hypercall::FsRename => {
            value >= 0
        }
        _ => false,
    }
}

/// Every entry beneath `dir` (not following links): no setuid or setgid bit.
fn check_modes(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read mount") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("metadata");
        let mode = meta.mode();
        assert!(
            mode & (libc::S_ISUID | libc::S_ISGID) == 0,
            "{} was made with mode {mode:o}",
            entry.path().display()
        );
        if meta.is_dir() {
            check_modes(&entry.path());
        }
    }
}

/// Make `dir` and everything beneath it removable (a guest may make a directory mode 0).
fn make_writable(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&entry.path());
            }
        }
    }
}

/// Empty the mount's directory (itself stays, so its parent is unchanged) and refill it.
fn remake_mount(world: &World) {
    for entry in std::fs::read_dir(&world.mount).expect("read mount") {
        let entry = entry.expect("entry");
        let path = entry.path();
        if !entry.file_type().expect("type").is_dir() {
            std::fs::remove_file(&path).expect("remove a file");
        } else if std::fs::remove_dir_all(&path).is_err() {
            make_writable(&path);
            std::fs::remove_dir_all(&path).expect("remove a directory");
        }
    }
    make_mount(&world.mount, world.canary.parent().expect("outside"));
}

fn run(world: &World, fs: &FileSystem, input: &mut Input) -> bool {
    let mem = GuestMem {
        ram: &world.guest.ram,
        plan: &world.guest.plan,
    };
    let mut changed = false;
    let mut last_fd = FS_FIRST_FD;
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            0 | 1 => {
                let slot = input.u8() as u64 % 8;
                set_path(world, input, slot);
            }
            2 => {
                let start = world.guest.plan.image.start;
                let at = start + input.u32() as u64 % (MEM_SIZE - start);
                let bytes: Vec<u8> = (0..input.u8()).map(|_| input.u8()).collect();
                let _ = world.guest.ram.write_bytes(at, &bytes);
            }
            _ => {
                let nr = match input.u8() {
                    b @ 0..=0xef => Hypercall::FsOpen as u64 + b as u64 % 12,
                    _ => input.u8() as u64,
                };
                let Some(kind) = Hypercall::from_raw(nr) else {
                    continue;
                };
                let a = [
                    arg(world, input, last_fd),
                    arg(world, input, last_fd),
                    arg(world, input, last_fd),
                    arg(world, input, last_fd),
                ];
                let result = fs.call(&mem, kind, a);
                let Ok(value) = result else {
                    // A violation (the VM would end the guest); what was open stays open.
                    changed |= may_change(kind, &a, 0);
                    continue;
                };
                assert!(value >= -4095, "{kind:?} {a:x?} answered {value}");
                changed |= may_change(kind, &a, value);
                if value < 0 {
                    continue;
                }
                match kind {
                    Hypercall::FsOpen => {
                        let fds = FS_FIRST_FD..FS_FIRST_FD + FS_MAX_FDS as u64;
                        assert!(fds.contains(&(value as u64)), "fs_open gave fd {value}");
                        last_fd = value as u64;
                        let stat = fs.call(&mem, Hypercall::FsFstat, [last_fd, ORACLE_STAT, 0, 0]);
                        assert_eq!(stat, Ok(0), "fs_fstat of a new descriptor");
                        check_stat(world, ORACLE_STAT, "fs_open");
                    }
                    Hypercall::FsRead | Hypercall::FsWrite | Hypercall::FsGetdents => {
                        assert!(value as u64 <= a[2], "{kind:?} {a:x?} answered {value}");
                    }
                    Hypercall::FsStat | Hypercall::FsFstat => {
                        assert_eq!(value, 0);
                        check_stat(world, a[1], kind.name());
                    }
                    Hypercall::FsMkdir | Hypercall::FsUnlink | Hypercall::FsRename => {
                        assert_eq!(value, 0)
                    }
                    _ => {}
                }
            }
        }
    }
    changed
}

fn check_host(world: &World, full: bool) {
    for (path, before) in &world.watched {
        assert_eq!(&snapshot(path), before, "{} changed", path.display());
    }
    if full {
        assert_eq!(std::fs::read(&world.canary).expect("canary"), CANARY);
        let outside: Vec<_> = std::fs::read_dir(world.canary.parent().unwrap())
            .expect("outside")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(outside, ["canary"], "outside's listing");
    }
    let image = world.guest.plan.image.start;
    let low = world
        .guest
        .ram
        .read_bytes(image - LOW_GUARD, LOW_GUARD)
        .unwrap();
    assert!(
        low.iter().all(|&b| b == 0xa5),
        "RAM below the image written"
    );
}

fuzz_target!(|data: &[u8]| {
    static INPUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let world = world();
    let n = INPUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let fs = FileSystem::open(&world.configs).expect("mounts");
    let changed = run(world, &fs, &mut Input(data));
    drop(fs);
    assert_eq!(lowest_free_fd(), world.free_fd, "a host descriptor leaked");
    check_host(world, changed || n % 1024 == 0);
    if changed {
        check_modes(&world.mount);
        remake_mount(world);
    }
});
