//! `cargo xtask`: builds the bare-metal guests, and runs the demo, the test suite and the
//! benchmarks (the README's commands) with the guests built first.
//!
//! The guests (workspace `guests/`) need Debian's Rust toolchain (`/usr/bin/cargo`,
//! `/usr/bin/rustc` 1.96 with `RUSTC_BOOTSTRAP=1` for `-Zbuild-std` and the custom target
//! `guests/x86_64-activm.json`) and `ld.lld-16`; this tool installs them if missing and runs that
//! cargo with a clean environment (none of the outer rustup cargo's variables).

mod app;
mod fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod aarch64;
mod elfcheck;

use elfcheck::check_elf;

/// Debian packages the guest build needs.
const PACKAGES: &[&str] = &["rustc-web", "rust-web-src", "lld-16", "rust-web-clippy"];
/// The guest toolchain.
const GUEST_CARGO: &str = "/usr/bin/cargo";
const GUEST_RUSTC: &str = "/usr/bin/rustc";
/// The guest toolchain's clippy (package rust-web-clippy), rustc with the lints.
const GUEST_CLIPPY_DRIVER: &str = "/usr/bin/clippy-driver";
/// The guest architectures: custom targets guests/<arch>-activm.json.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GuestArch {
    X86_64,
    Aarch64,
}

impl GuestArch {
    /// The custom target's name (its JSON file and its output directory under guests/target).
    fn target(self) -> &'static str {
        match self {
            GuestArch::X86_64 => "x86_64-activm",
            GuestArch::Aarch64 => "aarch64-activm",
        }
    }
    /// Where the BootHeader must be.
    fn image_base(self) -> u64 {
        match self {
            GuestArch::X86_64 => protocol::arch::x86_64::IMAGE_BASE,
            GuestArch::Aarch64 => protocol::arch::aarch64::IMAGE_BASE,
        }
    }
    /// `BootHeader::arch`.
    fn boot_header_arch(self) -> u32 {
        match self {
            GuestArch::X86_64 => protocol::Arch::X86_64 as u32,
            GuestArch::Aarch64 => protocol::Arch::Aarch64 as u32,
        }
    }
    /// ELF e_machine: EM_X86_64, EM_AARCH64.
    fn elf_machine(self) -> u16 {
        match self {
            GuestArch::X86_64 => 62,
            GuestArch::Aarch64 => 183,
        }
    }
}

const USAGE: &str = "\
usage: cargo xtask COMMAND
  demo [--vcpus N]               build everything and boot the demo guest (default 4 vCPUs)
  test                           build the guests, run the whole test suite (cargo test --workspace),
                                 then aarch64-test, then each fuzz target for a few seconds
  bench [NAME]                   build the guests, then run the benchmarks (or only benches/NAME)
  build-guests [--release] [--arch x86_64|aarch64]
                                 install the guest toolchain if missing, build guests/ and the std
                                 guests guests/apps/std-*, print the ELF paths
  aarch64-test [--keep] [--only NAME,...] [--smp N]
                                 end to end on arm64 KVM inside QEMU (installs QEMU and an arm64
                                 kernel when missing; exit status 77 = skipped; --only runs the
                                 named cases, `prefix*` allowed; --smp: the QEMU
                                 machine's CPUs, default 2)
  clippy-guests [--arch ARCH]    run clippy on the guest workspace for the guest target, then on the
                                 std guests guests/apps/std-* for their std target (-D warnings)
  guest-path APP [--release]     print the path of guest APP's ELF (e.g. demo, selftest)
  fuzz [TARGET] [--seconds N]    build the fuzz targets (fuzz/) and run each (or TARGET) for N s (default 60)
  app PATH [--release] [--bin NAME | --test NAME] [--target-dir DIR] [--arch x86_64|aarch64]
                                 build the ordinary `std` Rust program (cargo project) at PATH into an
                                 activm guest (see docs/std-guests.md) and print the ELF's path;
                                 --test: its test target NAME, with libtest's harness
  install-toolchain              only install the Debian packages the guest build needs";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("test") => no_more(&args[1..]).and_then(|()| test()),
        Some("bench") => bench(&args[1..]),
        Some("build-guests") => build_guests_cmd(&args[1..]),
        Some("aarch64-test") => {
            return match aarch64::test(&args[1..]) {
                Ok(()) => ExitCode::SUCCESS,
                Err(aarch64::Failure::Skipped(why)) => {
                    eprintln!("xtask: aarch64-test: ***** SKIPPED, NOT PASSED: {why} *****");
                    ExitCode::from(aarch64::SKIPPED)
                }
                Err(aarch64::Failure::Failed(e)) => {
                    eprintln!("xtask: aarch64-test: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("clippy-guests") => parse_arch(&args[1..]).and_then(clippy_guests),
        Some("guest-path") => guest_path(&args[1..]),
        Some("app") => app::app(&args[1..]),
        Some("fuzz") => fuzz::command(&repo_root(), &args[1..]),
        Some("install-toolchain") => no_more(&args[1..]).and_then(|()| install_toolchain()),
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown or missing command\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The outer (host) cargo, the one running this xtask.
fn host_cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(repo_root());
    cmd
}

fn demo(args: &[String]) -> Result<(), String> {
    let vcpus = match args {
        [] => "4".to_string(),
        [flag, n] if flag == "--vcpus" => n.clone(),
        _ => return Err(format!("usage: cargo xtask demo [--vcpus N]\n{USAGE}")),
    };
    build_guests(true)?;
    run(host_cargo().args(["build", "--release", "--quiet", "-p", "activm-vmm"]))?;
    let activm = repo_root().join("target/release/activm");
    let demo = elf_path("demo", true);
    println!(
        "xtask: {} run {} --vcpus {vcpus}",
        activm.display(),
        demo.display()
    );
    run(Command::new(activm)
        .arg("run")
        .arg(demo)
        .args(["--vcpus", &vcpus]))
}

fn test() -> Result<(), String> {
    build_guests(true)?;
    run(host_cargo().args(["test", "--workspace"]))?;
    // The aarch64 back end, end to end under arm64 KVM inside QEMU: skipped (loudly) where
    // QEMU or the packages cannot be had, never reported as passed.
    match aarch64::test(&[]) {
        Ok(()) => Ok(()),
        Err(aarch64::Failure::Skipped(why)) => {
            eprintln!("xtask: test: ***** aarch64 end-to-end SKIPPED, NOT PASSED: {why} *****");
            Ok(())
        }
        Err(aarch64::Failure::Failed(e)) => Err(e),
    }?;
    // A smoke run of every fuzz target from its committed seeds.
    fuzz::run_targets(&repo_root(), fuzz::TARGETS, fuzz::SMOKE_SECONDS)
}

fn bench(args: &[String]) -> Result<(), String> {
    build_guests(true)?;
    let mut cmd = host_cargo();
    cmd.args(["bench", "-p", "activm-benches"]);
    match args {
        [] => {}
        [name] => {
            cmd.args(["--bench", name]);
        }
        _ => return Err(format!("usage: cargo xtask bench [NAME]\n{USAGE}")),
    }
    run(&mut cmd)
}

fn no_more(args: &[String]) -> Result<(), String> {
    match args.first() {
        None => Ok(()),
        Some(a) => Err(format!("unexpected argument `{a}`\n{USAGE}")),
    }
}

fn parse_release(args: &[String]) -> Result<bool, String> {
    match args {
        [] => Ok(false),
        [flag] if flag == "--release" => Ok(true),
        [a, ..] => Err(format!("unexpected argument `{a}`\n{USAGE}")),
    }
}

/// The repository (the host workspace's root), found at run time from the current directory
/// with `cargo locate-project --workspace`, so a moved or copied checkout works.
fn repo_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let located = Command::new(cargo)
            .args(["locate-project", "--workspace", "--message-format", "plain"])
            .output();
        match located {
            Ok(out) if out.status.success() => {
                let manifest = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                let root = manifest.parent().map(Path::to_path_buf);
                if let Some(root) = root.filter(|r| r.join("xtask/Cargo.toml").is_file()) {
                    return root;
                }
                eprintln!(
                    "xtask: error: {} is not activm's host workspace: run from the repository root",
                    manifest.display()
                );
                std::process::exit(2);
            }
            _ => {
                eprintln!(
                    "xtask: error: cargo locate-project failed: run inside the activm repository"
                );
                std::process::exit(2);
            }
        }
    })
    .clone()
}

fn guests_dir() -> PathBuf {
    repo_root().join("guests")
}

fn profile_dir(release: bool) -> &'static str {
    if release {
        "release"
    } else {
        "debug"
    }
}

/// The ELF of x86_64 guest `app`.
fn elf_path(app: &str, release: bool) -> PathBuf {
    elf_path_for(GuestArch::X86_64, app, release)
}

/// The ELF of guest `app` for `arch` (a std guest's is under its std target's directory).
fn elf_path_for(arch: GuestArch, app: &str, release: bool) -> PathBuf {
    let std_test = app::STD_TEST_APPS.iter().any(|(name, _)| *name == app);
    let target = if app::STD_APPS.contains(&app) || std_test {
        app::std_target(arch)
    } else {
        arch.target()
    };
    guests_dir()
        .join("target")
        .join(target)
        .join(profile_dir(release))
        .join(app)
}

/// The guest apps: the directories under guests/apps.
fn apps() -> Result<Vec<String>, String> {
    // The guest workspace's members under apps/ (a folder there that is not a member yet, such
    // as an app waiting for a crate it needs, is not built and not checked).
    let manifest = guests_dir().join("Cargo.toml");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut apps: Vec<String> = text
        .split('"')
        .filter_map(|item| item.strip_prefix("apps/"))
        .filter(|name| !name.is_empty() && !name.contains('/'))
        .map(str::to_string)
        .collect();
    apps.sort();
    apps.dedup();
    Ok(apps)
}

fn guest_path(args: &[String]) -> Result<(), String> {
    let (app, rest) = args
        .split_first()
        .ok_or_else(|| format!("guest-path needs an app name\n{USAGE}"))?;
    let release = parse_release(rest)?;
    let path = elf_path(app, release);
    if !path.is_file() {
        let flag = if release { " --release" } else { "" };
        eprintln!(
            "xtask: note: {} is not built yet (cargo xtask build-guests{flag})",
            path.display()
        );
    }
    println!("{}", path.display());
    Ok(())
}

/// Whether `pkg` is installed, according to dpkg.
fn dpkg_installed(pkg: &str) -> Result<bool, String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map_err(|e| {
            format!("cannot run dpkg-query ({e}): the guest toolchain needs a Debian-based system")
        })?;
    Ok(out.status.success()
        && String::from_utf8_lossy(&out.stdout)
            .trim_end()
            .ends_with(" installed"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed: {status}"))
    }
}

/// Installs the missing Debian packages (idempotent: nothing happens if all are there).
fn install_toolchain() -> Result<(), String> {
    let mut missing = Vec::new();
    for pkg in PACKAGES {
        if !dpkg_installed(pkg)? {
            missing.push(*pkg);
        }
    }
    if missing.is_empty() {
        println!("xtask: guest toolchain present ({})", PACKAGES.join(" "));
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "guest toolchain packages missing: {}; installing them needs root: run `apt-get install -y {}` as root, or run this as root",
            missing.join(" "),
            missing.join(" ")
        ));
    }
    println!(
        "xtask: installing guest toolchain: apt-get update && apt-get install -y {}",
        missing.join(" ")
    );
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

/// Whether an environment variable of the outer (rustup) cargo must not reach the guest cargo.
fn leaks(name: &str) -> bool {
    const KEEP: &[&str] = &[
        "CARGO_HOME",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRY",
        "CARGO_REGISTRIES_",
        "CARGO_TERM_",
    ];
    if name.starts_with("CARGO") {
        return !KEEP.iter().any(|k| name.starts_with(k));
    }
    name.starts_with("RUSTUP_TOOLCHAIN")
        || name.starts_with("RUSTC")
        || name.starts_with("RUSTDOC")
        || name == "RUSTFLAGS"
        || name == "RUST_RECURSION_COUNT"
}

/// The guest cargo, in guests/, with a clean environment.
fn guest_cargo() -> Command {
    let mut cmd = Command::new(GUEST_CARGO);
    cmd.current_dir(guests_dir());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(leaks) {
            cmd.env_remove(&name);
        }
    }
    cmd.env("RUSTC", GUEST_RUSTC).env("RUSTC_BOOTSTRAP", "1");
    // Debian's tools first: `cargo clippy` runs the first `cargo-clippy` on PATH, and rustup's
    // proxies (~/.cargo/bin) would pick rustup's toolchain.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![PathBuf::from("/usr/bin")];
    dirs.extend(std::env::split_paths(&path));
    if let Ok(path) = std::env::join_paths(dirs) {
        cmd.env("PATH", path);
    }
    cmd
}

fn build_guests(release: bool) -> Result<(), String> {
    build_guests_for(GuestArch::X86_64, release)
}

/// `build-guests [--release] [--arch ARCH]`.
fn build_guests_cmd(args: &[String]) -> Result<(), String> {
    let mut release = false;
    let mut arch = GuestArch::X86_64;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--release" => release = true,
            "--arch" => {
                let value = rest.next().cloned().unwrap_or_default();
                arch = parse_arch(&["--arch".to_string(), value])?;
            }
            a => return Err(format!("unexpected argument `{a}`\n{USAGE}")),
        }
    }
    build_guests_for(arch, release)
}

/// Builds the guests for `arch` (aarch64: only the apps ported so far, [`aarch64::APPS`]).
fn build_guests_for(arch: GuestArch, release: bool) -> Result<(), String> {
    install_toolchain()?;
    let mut cmd = guest_cargo();
    cmd.arg("build");
    if release {
        cmd.arg("--release");
    }
    let apps = match arch {
        GuestArch::X86_64 => apps()?,
        GuestArch::Aarch64 => {
            let target = format!("{}.json", arch.target());
            cmd.args(["--target", &target]);
            for app in aarch64::APPS {
                cmd.args(["-p", app]);
            }
            aarch64::APPS.iter().map(|a| a.to_string()).collect()
        }
    };
    println!(
        "xtask: building guests: cd guests && RUSTC={GUEST_RUSTC} RUSTC_BOOTSTRAP=1 {GUEST_CARGO} {}",
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    run(&mut cmd)?;
    for app in apps {
        let path = elf_path_for(arch, &app, release);
        check_elf(arch, &path)?;
        println!("{}", path.display());
    }
    // The std guests (guests/ARCH-activm-std.json).
    for path in app::build_std_apps(arch, release)? {
        println!("{}", path.display());
    }
    Ok(())
}

fn clippy_guests(arch: GuestArch) -> Result<(), String> {
    install_toolchain()?;
    let mut cmd = guest_cargo();
    cmd.arg("clippy");
    match arch {
        GuestArch::X86_64 => {
            cmd.arg("--workspace");
        }
        GuestArch::Aarch64 => {
            cmd.args(["--target", "aarch64-activm.json", "-p", "activm-std"]);
            for app in aarch64::APPS {
                cmd.args(["-p", app]);
            }
        }
    }
    cmd.args(["--", "-D", "warnings"]);
    println!(
        "xtask: cd guests && RUSTC={GUEST_RUSTC} RUSTC_BOOTSTRAP=1 {GUEST_CARGO} {}",
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    run(&mut cmd)?;
    // The std guests (guests/apps/std-*), each its own workspace: the ones build-guests builds.
    app::clippy_std_apps(arch)
}

/// `[--arch x86_64|aarch64]`.
fn parse_arch(args: &[String]) -> Result<GuestArch, String> {
    match args {
        [] => Ok(GuestArch::X86_64),
        [flag, arch] if flag == "--arch" => match arch.as_str() {
            "x86_64" => Ok(GuestArch::X86_64),
            "aarch64" => Ok(GuestArch::Aarch64),
            other => Err(format!("--arch takes x86_64 or aarch64, not `{other}`")),
        },
        [a, ..] => Err(format!("unexpected argument `{a}`\n{USAGE}")),
    }
}
