//! `cargo xtask aarch64-test`: activm end to end on arm64 KVM.
//!
//! The development machines are x86_64 without arm64 KVM, but QEMU's TCG emulates EL2, so an
//! arm64 Linux inside `qemu-system-aarch64 -M virt,virtualization=on,gic-version=3` has a real
//! `/dev/kvm` with a GICv3. This command:
//!
//! 1. installs what it needs with apt when missing (QEMU, cpio, the cross gcc and libc, and the
//!    arm64 architecture for `apt-get download`),
//! 2. caches an arm64 Debian kernel and `busybox-static` under `target/aarch64-cache`,
//! 3. builds a static aarch64 `activm` and the aarch64 guests,
//! 4. packs them into an initramfs whose `/init` runs each case and prints its output and exit
//!    status between markers on the serial console,
//! 5. boots QEMU and checks every case's status and expected lines.
//!
//! If QEMU or the packages cannot be had, it says so loudly and reports the run as SKIPPED
//! (exit status [`SKIPPED`]), never as passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{dpkg_installed, is_root, repo_root, run};

mod app_cases;
mod case;
mod cases;
mod hostile_cases;
mod std_cases;

use case::{Case, STDOUT_BEGIN, STDOUT_END};
use cases::cases;

/// Exit status of a skipped run (the automake convention).
pub const SKIPPED: u8 = 77;

/// Host packages: emulator, initramfs packer, cross linker and C library for `+crt-static`.
const HOST_PACKAGES: &[&str] = &[
    "qemu-system-arm",
    "cpio",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
];
const RUST_TARGET: &str = "aarch64-unknown-linux-gnu";
const CROSS_GCC: &str = "aarch64-linux-gnu-gcc";
/// Guest apps that build for aarch64 so far.
pub const APPS: &[&str] = &[
    "demo",
    "archcheck",
    "rt-demo",
    "rt-tests",
    "iobench",
    "selftest",
    "threadbench",
    "nbody",
    "hostile",
];
/// Whole QEMU run (boot + every case, about 90) under TCG on a shared machine: 5-6 min quiet,
/// several times that at a load average of 20 on 2 cores.
const QEMU_TIMEOUT: Duration = Duration::from_secs(1800);

/// Why the run could not happen (reported as SKIPPED), or a real failure.
pub enum Failure {
    Skipped(String),
    Failed(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Failed(e)
    }
}

fn cache_dir() -> PathBuf {
    repo_root().join("target/aarch64-cache")
}

/// The whole command. `Ok` only if every case passed.
pub fn test(args: &[String]) -> Result<(), Failure> {
    let mut keep = false;
    // The arm64 machine's processors: 2, as many as the development machines have.
    let mut smp = 2u32;
    let mut only: Option<Vec<String>> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--keep" => keep = true,
            "--smp" => match rest.next().and_then(|n| n.parse().ok()) {
                Some(n @ 1..=8) => smp = n,
                _ => {
                    return Err(Failure::Failed(
                        "--smp needs a CPU count from 1 to 8".into(),
                    ))
                }
            },
            "--only" => match rest.next() {
                Some(names) => only = Some(names.split(',').map(String::from).collect()),
                None => return Err(Failure::Failed("--only needs NAME[,NAME...]".into())),
            },
            a => return Err(Failure::Failed(format!("unexpected argument `{a}`"))),
        }
    }
    let mut cases = cases();
    if let Some(only) = &only {
        // A name ending in `*` is a prefix.
        let wanted = |name: &str| {
            only.iter().any(|o| match o.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == o,
            })
        };
        cases.retain(|c| wanted(&c.name));
        if cases.is_empty() {
            return Err(Failure::Failed(format!(
                "--only {}: no such case",
                only.join(",")
            )));
        }
    }
    ensure_host_packages()?;
    let (kernel, busybox) = ensure_kernel_and_busybox()?;
    let activm = build_activm()?;
    crate::build_guests_for(crate::GuestArch::Aarch64, true)?;
    let initrd = make_initramfs(&activm, &busybox, &cases)?;
    let console = boot(&kernel, &initrd, smp)?;
    let log = cache_dir().join("console.log");
    std::fs::write(&log, &console).map_err(|e| format!("{}: {e}", log.display()))?;
    println!("xtask: aarch64: console log in {}", log.display());
    let verdict = check(&console, &cases);
    if !keep {
        let _ = std::fs::remove_file(&initrd);
    }
    verdict.map_err(Failure::Failed)
}

fn skip(why: String) -> Failure {
    Failure::Skipped(why)
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt(args: &[&str]) -> Result<(), String> {
    run(Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Installs the host packages and enables the arm64 architecture (idempotent).
fn ensure_host_packages() -> Result<(), Failure> {
    let mut missing = Vec::new();
    for pkg in HOST_PACKAGES {
        if !dpkg_installed(pkg).map_err(skip)? {
            missing.push(*pkg);
        }
    }
    let foreign = Command::new("dpkg")
        .arg("--print-foreign-architectures")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("arm64"))
        .unwrap_or(false);
    if missing.is_empty() && foreign {
        return Ok(());
    }
    if !is_root() {
        return Err(skip(format!(
            "needs root to install {} and add the arm64 architecture",
            missing.join(" ")
        )));
    }
    if !foreign {
        run(Command::new("dpkg").args(["--add-architecture", "arm64"])).map_err(skip)?;
    }
    println!("xtask: aarch64: apt-get install {}", missing.join(" "));
    apt(&["update", "-q"]).map_err(skip)?;
    if !missing.is_empty() {
        let mut args = vec!["install", "-y", "-q"];
        args.extend(&missing);
        apt(&args).map_err(skip)?;
    }
    for tool in ["qemu-system-aarch64", "cpio", CROSS_GCC] {
        if !have(tool) {
            return Err(skip(format!(
                "`{tool}` still missing after apt-get install"
            )));
        }
    }
    Ok(())
}

/// The newest `linux-image-<version>-arm64` the archive offers.
fn kernel_package() -> Result<String, Failure> {
    let out = Command::new("apt-cache")
        .args(["search", "--names-only", "^linux-image-[0-9].*-arm64$"])
        .output()
        .map_err(|e| skip(format!("apt-cache: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.ends_with("-arm64") && !n.contains("unsigned") && !n.contains("-rt-"))
        .collect();
    // Versions like 6.1.0-47: compare the numeric parts.
    names.sort_by_key(|n| {
        n.trim_start_matches("linux-image-")
            .split(['.', '-'])
            .filter_map(|p| p.parse::<u64>().ok())
            .collect::<Vec<_>>()
    });
    names
        .last()
        .map(|n| n.to_string())
        .ok_or_else(|| skip("apt-cache finds no linux-image-*-arm64 package".into()))
}

/// Downloads (once) and unpacks the arm64 kernel and busybox into the cache.
fn ensure_kernel_and_busybox() -> Result<(PathBuf, PathBuf), Failure> {
    let cache = cache_dir();
    let root = cache.join("root");
    let busybox = root.join("bin/busybox");
    let find_kernel = || -> Option<PathBuf> {
        let boot = root.join("boot");
        std::fs::read_dir(&boot)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if let (Some(kernel), true) = (find_kernel(), busybox.is_file()) {
        return Ok((kernel, busybox));
    }
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs).map_err(|e| format!("{}: {e}", debs.display()))?;
    let kernel_pkg = kernel_package()?;
    println!("xtask: aarch64: apt-get download {kernel_pkg}:arm64 busybox-static:arm64");
    run(Command::new("apt-get").current_dir(&debs).args([
        "download",
        &format!("{kernel_pkg}:arm64"),
        "busybox-static:arm64",
    ]))
    .map_err(skip)?;
    for entry in std::fs::read_dir(&debs).map_err(|e| format!("{}: {e}", debs.display()))? {
        let deb = entry.map_err(|e| e.to_string())?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        }
    }
    match (find_kernel(), busybox.is_file()) {
        (Some(kernel), true) => Ok((kernel, busybox)),
        _ => Err(Failure::Failed(format!(
            "{}: no boot/vmlinuz-* or bin/busybox after unpacking",
            root.display()
        ))),
    }
}

/// A static aarch64 `activm` (rustup's std for the target, the cross gcc as linker).
fn build_activm() -> Result<PathBuf, Failure> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(RUST_TARGET))
        .unwrap_or(false);
    if !installed {
        println!("xtask: aarch64: rustup target add {RUST_TARGET}");
        run(Command::new("rustup").args(["target", "add", RUST_TARGET]))
            .map_err(|e| skip(format!("no Rust std for {RUST_TARGET}: {e}")))?;
    }
    let env_target = RUST_TARGET.to_uppercase().replace('-', "_");
    run(crate::host_cargo()
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "activm-vmm",
            "--bin",
            "activm",
        ])
        .args(["--target", RUST_TARGET])
        .env(format!("CARGO_TARGET_{env_target}_LINKER"), CROSS_GCC)
        .env(
            format!("CARGO_TARGET_{env_target}_RUSTFLAGS"),
            "-C target-feature=+crt-static",
        ))?;
    Ok(repo_root().join(format!("target/{RUST_TARGET}/release/activm")))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))
}

/// The `/init` script: mount, check `/dev/kvm`, run every case between markers, power off.
fn init_script(cases: &[Case]) -> String {
    let mut s = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         echo \"@@ uname: $(uname -m) $(uname -r)\"\n\
         [ -c /dev/kvm ] && echo '@@ /dev/kvm present' || echo '@@ /dev/kvm MISSING'\n",
    );
    for case in cases {
        s.push_str(&format!(
            "echo '@@BEGIN {name}: {cmd}'\n{cmd} 2>&1\necho \"@@END {name} status=$?\"\n",
            name = case.name,
            cmd = case.command
        ));
    }
    s.push_str("echo '@@DONE'\npoweroff -f\n");
    s
}

fn make_initramfs(activm: &Path, busybox: &Path, cases: &[Case]) -> Result<PathBuf, String> {
    let dir = cache_dir().join("initrd");
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["bin", "proc", "sys", "dev", "guests", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    copy(busybox, &dir.join("bin/busybox"))?;
    copy(activm, &dir.join("activm"))?;
    for app in APPS.iter().chain(std_cases::STD_APPS) {
        copy(
            &crate::elf_path_for(crate::GuestArch::Aarch64, app, true),
            &dir.join("guests").join(app),
        )?;
    }
    let init = dir.join("init");
    std::fs::write(&init, init_script(cases)).map_err(|e| format!("{}: {e}", init.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", init.display()))?;
    let out = cache_dir().join("initrd.cpio");
    run(Command::new("sh").current_dir(&dir).args([
        "-c",
        &format!("find . | cpio --quiet -o -H newc > {}", out.display()),
    ]))?;
    Ok(out)
}

/// Boots QEMU and returns everything it printed (stops it after [`QEMU_TIMEOUT`]).
fn boot(kernel: &Path, initrd: &Path, smp: u32) -> Result<String, Failure> {
    let mut cmd = Command::new("qemu-system-aarch64");
    cmd.args(["-M", "virt,virtualization=on,gic-version=3"])
        .args(["-cpu", "max", "-smp", &smp.to_string(), "-m", "1024"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyAMA0 panic=-1 rdinit=/init quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!(
        "xtask: aarch64: qemu-system-aarch64 -M virt,virtualization=on,gic-version=3 -cpu max -smp {smp} -m 1024 -kernel {} -initrd {}",
        kernel.display(),
        initrd.display()
    );
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| skip(format!("cannot start qemu-system-aarch64: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    // Read on a thread so the timeout below can stop QEMU.
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            // Echo the case output live; kernel chatter stays in the log.
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text).into_owned()
    });
    let mut timed_out = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > QEMU_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                timed_out = true;
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(Failure::Failed(format!("waiting for QEMU: {e}"))),
        }
    }
    let text = reader.join().unwrap_or_default();
    println!(
        "xtask: aarch64: QEMU ran {:.1} s{}",
        started.elapsed().as_secs_f64(),
        if timed_out {
            " (TIMED OUT, killed)"
        } else {
            ""
        }
    );
    Ok(text)
}

/// The guest stdout a [`case::stdout_of`] command printed between its markers.
fn guest_stdout(output: &str) -> Option<&str> {
    let begin = format!("\n{STDOUT_BEGIN}\n");
    let start = output.find(&begin)? + begin.len();
    let len = output[start..].find(&format!("{STDOUT_END}\n"))?;
    Some(&output[start..start + len])
}

/// Prints each case's output and checks its status and expected lines.
fn check(console: &str, cases: &[Case]) -> Result<(), String> {
    let console = console.replace('\r', "");
    if let Some(line) = console.lines().find(|l| l.contains("@@ /dev/kvm")) {
        println!("{line}");
    }
    let mut failures = Vec::new();
    for case in cases {
        let begin = format!("@@BEGIN {}:", case.name);
        let end = format!("@@END {} status=", case.name);
        let Some(start) = console.find(&begin) else {
            failures.push(format!("{}: never started", case.name));
            continue;
        };
        let body = &console[start..];
        let Some(stop) = body.find(&end) else {
            println!("{body}");
            failures.push(format!(
                "{}: no end marker (guest or kernel hung?)",
                case.name
            ));
            continue;
        };
        let output = &body[..stop];
        let status: i32 = body[stop + end.len()..]
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1);
        println!("{output}@@END {} status={status}", case.name);
        if status != case.status {
            failures.push(format!(
                "{}: exit status {status}, expected {}",
                case.name, case.status
            ));
        }
        for want in &case.expect {
            if !output.lines().any(|l| l.contains(want.as_str())) {
                failures.push(format!("{}: missing line `{want}`", case.name));
            }
        }
        if let Some(Err(why)) = case.check.map(|check| check(output)) {
            failures.push(format!("{}: {why}", case.name));
        }
        if let Some(want) = &case.stdout {
            match guest_stdout(output) {
                Some(got) if got == want => {}
                Some(got) => failures.push(format!(
                    "{}: stdout differs\n--- got\n{got}--- wanted\n{want}",
                    case.name
                )),
                None => failures.push(format!("{}: no guest stdout markers", case.name)),
            }
        }
    }
    if failures.is_empty() {
        println!(
            "xtask: aarch64: {} of {} cases passed",
            cases.len(),
            cases.len()
        );
        Ok(())
    } else {
        Err(format!(
            "aarch64 end-to-end failed:\n  {}",
            failures.join("\n  ")
        ))
    }
}
