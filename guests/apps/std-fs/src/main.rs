//! std::fs inside activm mounts. `ops`: create, write, read, seek, stat, readdir, mkdir,
//! rename, unlink in /data (a writable mount) and reads in /ro (a read-only one). `escape
//! OUTSIDE`: attempts to reach files outside the mount (OUTSIDE is the host directory beside
//! it), each printed as `refused (errno N)` or `ESCAPED`. The host checks its side. `slow N`:
//! reads /data/cold.bin (which the host evicted from its page cache) and appends to and
//! fsyncs a file N times, while another thread computes: the calls that wait for the host
//! block the vCPU in the VMM, holding no processor.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::raw::c_char;

extern "C" {
    /// activm-std's: std's Hermit port has no rename nor fsync.
    fn sys_rename(old: *const c_char, new: *const c_char) -> i32;
    fn sys_fsync(fd: i32) -> i32;
    fn sys_open(name: *const c_char, flags: i32, mode: i32) -> i32;
}

fn rename(old: &str, new: &str) -> io::Result<()> {
    let (old, new) = (cstr(old), cstr(new));
    // SAFETY: two NUL-terminated strings.
    let r = unsafe { sys_rename(old.as_ptr(), new.as_ptr()) };
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(())
    }
}

fn cstr(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap()
}

fn errno<T>(r: io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match e.raw_os_error() {
            Some(n) => format!("errno {n}"),
            None => format!("error {:?}", e.kind()),
        },
    }
}

fn names(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn ops() {
    let mut f = File::create("/data/a.txt").unwrap();
    f.write_all(b"hello world").unwrap();
    drop(f);
    let mut f = File::open("/data/a.txt").unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    println!("read: {s}");
    f.seek(SeekFrom::Start(6)).unwrap();
    s.clear();
    f.read_to_string(&mut s).unwrap();
    println!("seek 6: {s}");
    println!("seek end-5: {}", f.seek(SeekFrom::End(-5)).unwrap());
    let meta = f.metadata().unwrap();
    println!(
        "fstat: len {} file {} dir {}",
        meta.len(),
        meta.is_file(),
        meta.is_dir()
    );
    drop(f);
    let mut f = OpenOptions::new().append(true).open("/data/a.txt").unwrap();
    f.write_all(b"!").unwrap();
    // SAFETY: a descriptor of this program's open file.
    println!("fsync: {}", unsafe {
        sys_fsync(std::os::hermit::io::AsRawFd::as_raw_fd(&f))
    });
    drop(f);
    let meta = fs::metadata("/data/a.txt").unwrap();
    println!("stat: len {}", meta.len());
    fs::create_dir("/data/sub").unwrap();
    println!("mkdir again: {}", errno(fs::create_dir("/data/sub")));
    fs::write("/data/sub/b.txt", b"b").unwrap();
    println!(
        "stat dir: dir {}",
        fs::metadata("/data/sub").unwrap().is_dir()
    );
    println!("readdir /data: {:?}", names("/data"));
    rename("/data/a.txt", "/data/sub/c.txt").unwrap();
    println!(
        "rename: a {} c {}",
        errno(fs::metadata("/data/a.txt")),
        fs::read_to_string("/data/sub/c.txt").unwrap()
    );
    println!("rmdir non-empty: {}", errno(fs::remove_dir("/data/sub")));
    fs::remove_file("/data/sub/b.txt").unwrap();
    println!("unlink: {}", errno(fs::metadata("/data/sub/b.txt")));
    println!("readdir /data/sub: {:?}", names("/data/sub"));
    fs::create_dir("/data/many").unwrap();
    for i in 0..100 {
        File::create(format!("/data/many/file-with-a-longish-name-{i:03}")).unwrap();
    }
    println!("readdir 100: {}", names("/data/many").len());
    for i in 0..100 {
        fs::remove_file(format!("/data/many/file-with-a-longish-name-{i:03}")).unwrap();
    }
    fs::remove_dir("/data/many").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write("/data/big.bin", &big).unwrap();
    println!("big: equal {}", fs::read("/data/big.bin").unwrap() == big);
    let mut open = Vec::new();
    let exhausted = loop {
        match File::open("/data/big.bin") {
            Ok(f) => open.push(f),
            Err(e) => break e,
        }
    };
    println!(
        "open files: {} then {}",
        open.len(),
        errno::<()>(Err(exhausted))
    );
    drop(open);
    println!(
        "ro read: {}",
        fs::read_to_string("/ro/hello.txt").unwrap().trim()
    );
    println!("ro create: {}", errno(File::create("/ro/new.txt")));
    println!(
        "ro write: {}",
        errno(OpenOptions::new().write(true).open("/ro/hello.txt"))
    );
    println!("ro mkdir: {}", errno(fs::create_dir("/ro/d")));
    println!("ro unlink: {}", errno(fs::remove_file("/ro/hello.txt")));
    println!(
        "ro rename: {}",
        errno(rename("/ro/hello.txt", "/data/stolen.txt"))
    );
    println!("missing: {}", errno(File::open("/data/nope")));
    println!("done");
}

fn escape(outside: &str) {
    let tries: Vec<(&str, io::Result<String>)> = vec![
        ("dotdot", fs::read_to_string("/data/../outside/secret.txt")),
        (
            "dotdot2",
            fs::read_to_string("/data/sub/../../outside/secret.txt"),
        ),
        (
            "dotdot3",
            fs::read_to_string("/data/../../../../etc/hostname"),
        ),
        (
            "absolute host path",
            fs::read_to_string(format!("{outside}/secret.txt")),
        ),
        (
            "absolute inside mount",
            fs::read_to_string(format!("/data/{outside}/secret.txt")),
        ),
        ("unmapped", fs::read_to_string("/etc/passwd")),
        ("relative", fs::read_to_string("data/inside.txt")),
        (
            "symlink relative out",
            fs::read_to_string("/data/link_out/secret.txt"),
        ),
        (
            "symlink absolute",
            fs::read_to_string("/data/link_abs/secret.txt"),
        ),
        ("symlink file", fs::read_to_string("/data/link_file")),
        (
            "symlink /proc/self/root",
            fs::read_to_string("/data/link_proc/etc/hostname"),
        ),
        (
            "stat through symlink",
            fs::metadata("/data/link_out").map(|m| m.len().to_string()),
        ),
        (
            "readdir parent",
            fs::read_dir("/data/..").map(|_| String::new()),
        ),
        (
            "create outside",
            File::create("/data/../outside/new.txt").map(|_| String::new()),
        ),
        (
            "mkdir outside",
            fs::create_dir("/data/../newdir").map(|_| String::new()),
        ),
        (
            "unlink outside",
            fs::remove_file("/data/../outside/secret.txt").map(|_| String::new()),
        ),
        (
            "unlink via symlink",
            fs::remove_file("/data/link_out/secret.txt").map(|_| String::new()),
        ),
        (
            "rename to outside",
            rename("/data/inside.txt", "/data/../outside/moved.txt").map(|_| String::new()),
        ),
        (
            "rename from outside",
            rename("/data/link_out/secret.txt", "/data/stolen.txt").map(|_| String::new()),
        ),
        (
            "rename mount root",
            rename("/data", "/data/x").map(|_| String::new()),
        ),
        (
            "hard link",
            fs::hard_link("/data/inside.txt", "/data/hl").map(|_| String::new()),
        ),
    ];
    for (name, result) in tries {
        match result {
            Ok(_) => println!("{name}: ESCAPED"),
            Err(e) => println!("{name}: refused ({})", errno::<()>(Err(e))),
        }
    }
    // A directory renamed while paths through it are resolved: one thread swaps /data/r/a/b
    // up and down while this one opens /data/r/a/b/../../../outside/secret.txt.
    fs::create_dir_all("/data/r/a/b").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = rename("/data/r/a/b", "/data/b");
                let _ = rename("/data/b", "/data/r/a/b");
                n += 1;
            }
            n
        })
    };
    let mut escaped = 0;
    for _ in 0..300 {
        if fs::read_to_string("/data/r/a/b/../../../../outside/secret.txt").is_ok() {
            escaped += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    println!(
        "rename race: {} ({})",
        if escaped == 0 { "refused" } else { "ESCAPED" },
        swaps > 0
    );
    println!(
        "inside: {}",
        fs::read_to_string("/data/inside.txt").unwrap().trim()
    );
    println!("done");
}

fn slow(n: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut x = 1u64;
            let mut rounds = 0u64;
            while !done.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                rounds += 1;
            }
            std::hint::black_box(x);
            rounds
        })
    };
    let started = std::time::Instant::now();
    let bytes = fs::read("/data/cold.bin").unwrap();
    let hash = bytes
        .iter()
        .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    println!("cold: {} bytes, hash {hash:x}", bytes.len());
    let mut f = File::create("/data/synced.txt").unwrap();
    let mut synced = 0;
    for i in 0..n {
        writeln!(f, "line {i}").unwrap();
        // SAFETY: the descriptor of an open file.
        if unsafe { sys_fsync(std::os::hermit::io::AsRawFd::as_raw_fd(&f)) } == 0 {
            synced += 1;
        }
    }
    println!("fsync: {synced} of {n}");
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let rounds = worker.join().unwrap();
    // The other thread's progress meanwhile (timing: the test leaves this line out).
    eprintln!("slow calls: {elapsed:?}, the computing thread: {rounds} rounds");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("ops") => ops(),
        Some("escape") => escape(args.get(2).expect("escape OUTSIDE")),
        Some("slow") => slow(args.get(2).and_then(|n| n.parse().ok()).expect("slow N")),
        Some("bad-pointer") => {
            // SAFETY: deliberately not a string of this program: the VMM stops the guest.
            let r = unsafe { sys_open(0x10 as *const c_char, 0, 0) };
            println!("bad pointer: {r}");
        }
        _ => {
            eprintln!("usage: std-fs ops | escape OUTSIDE | slow N | bad-pointer");
            std::process::exit(2);
        }
    }
}
