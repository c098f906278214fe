//! `cargo xtask app PATH [--release] [--bin NAME | --test NAME] [--arch ARCH]`: builds an ordinary
//! `std` Rust program (a cargo project anywhere, unmodified) into an activm guest and prints the
//! ELF's path. With `--test NAME` it builds the project's test target NAME with libtest's harness
//! (std's `test` crate is built too), copied to `ARCH-activm-std/PROFILE/DIRNAME` (the project
//! directory's name) so it has a stable path.
//!
//! Two runs of the Debian cargo with the same target (`guests/ARCH-activm-std.json`: x86_64 by
//! default, aarch64 with `--arch aarch64`), the same `-Zbuild-std=std,panic_abort` and the same
//! profile settings, into the project's own target directory, so both use one build of std:
//! 1. `activm-std` (guest-std/: the hermit-abi functions std calls, on activm-rt), as a library;
//! 2. the project's binary with `cargo rustc`, which links that library in with
//!    `--extern force:activm_std=...` (the program never names it) and puts the stub's linker
//!    script on the search path.
//!
//! `clippy-guests` lints this repository's std guests with the same two runs, the second in check
//! mode with clippy-driver compiling the project's own crates.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{
    check_elf, guest_cargo, install_toolchain, parse_arch, profile_dir, repo_root, run, GuestArch,
    GUEST_CLIPPY_DRIVER, USAGE,
};

/// The `std` guest target of `arch`: its name, which is also its JSON file's under guests/ and
/// its output directory under the target directory.
pub(crate) fn std_target(arch: GuestArch) -> &'static str {
    match arch {
        GuestArch::X86_64 => "x86_64-activm-std",
        GuestArch::Aarch64 => "aarch64-activm-std",
    }
}

/// Where the stub's linker script (`link.ld`) for `arch` is, relative to the repository root.
fn link_script_dir(arch: GuestArch) -> &'static str {
    match arch {
        GuestArch::X86_64 => "guest-kernel-stub/src/arch/x86_64",
        GuestArch::Aarch64 => "guest-kernel-stub/src/arch/aarch64",
    }
}

struct Options {
    project: PathBuf,
    release: bool,
    arch: GuestArch,
    bin: Option<String>,
    /// A test target to build with libtest's harness instead of a binary.
    test: Option<String>,
    /// Cargo's target directory (default: the project's `target/`).
    target_dir: PathBuf,
}

/// The std guests of this repository (guests/apps/NAME, each its own workspace), built by
/// `build-guests` into guests/target/ARCH-activm-std/PROFILE/NAME with one build of std.
pub(crate) const STD_APPS: &[&str] = &[
    "std-demo",
    "std-fs",
    "std-rayon",
    "std-threadbench",
    "std-kv",
    "std-udp",
    "std-async",
];

/// The std guests of this repository that are a libtest binary: (guests/apps/NAME, its test
/// target). Built like [`STD_APPS`] with `--test`, into guests/target/ARCH-activm-std/PROFILE/NAME.
pub(crate) const STD_TEST_APPS: &[(&str, &str)] = &[("std-crossbeam-tests", "crossbeam_channel")];

fn parse(args: &[String]) -> Result<Options, String> {
    let usage = || {
        format!(
            "usage: cargo xtask app PATH [--release] [--bin NAME | --test NAME] [--target-dir DIR] [--arch ARCH]\n{USAGE}"
        )
    };
    let mut project = None;
    let mut release = false;
    let mut arch = GuestArch::X86_64;
    let mut bin = None;
    let mut test = None;
    let mut target_dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => release = true,
            "--arch" => {
                let value = it.next().ok_or_else(usage)?.clone();
                arch = parse_arch(&["--arch".to_string(), value])?;
            }
            "--bin" => bin = Some(it.next().ok_or_else(usage)?.clone()),
            "--test" => test = Some(it.next().ok_or_else(usage)?.clone()),
            "--target-dir" => target_dir = Some(PathBuf::from(it.next().ok_or_else(usage)?)),
            s if s.starts_with('-') => return Err(usage()),
            s if project.is_none() => project = Some(PathBuf::from(s)),
            _ => return Err(usage()),
        }
    }
    let project = project.ok_or_else(usage)?;
    if bin.is_some() && test.is_some() {
        return Err(usage());
    }
    let project = project
        .canonicalize()
        .map_err(|e| format!("{}: {e}", project.display()))?;
    if !project.join("Cargo.toml").is_file() {
        return Err(format!("{}: no Cargo.toml there", project.display()));
    }
    let target_dir = match target_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            dir.canonicalize()
                .map_err(|e| format!("{}: {e}", dir.display()))?
        }
        None => project.join("target"),
    };
    Ok(Options {
        project,
        release,
        arch,
        bin,
        test,
        target_dir,
    })
}

/// Settings both builds share. A crate built against another build of std cannot be linked
/// with it, so the profile is pinned here rather than taken from either manifest.
fn shared_args(cmd: &mut Command, o: &Options) {
    let root = repo_root();
    // libtest (std's `test` crate) only for a test build: the other std crates are the same.
    let crates = if o.test.is_some() {
        "-Zbuild-std=std,panic_abort,test"
    } else {
        "-Zbuild-std=std,panic_abort"
    };
    cmd.args([
        crates,
        "-Zbuild-std-features=compiler-builtins-mem",
        "-Zjson-target-spec",
    ])
    .arg("--target")
    .arg(
        root.join("guests")
            .join(format!("{}.json", std_target(o.arch))),
    )
    .arg("--target-dir")
    .arg(&o.target_dir);
    let profile = if o.release {
        cmd.arg("--release");
        [
            ("opt-level", "3"),
            ("debug", "1"),
            ("debug-assertions", "false"),
        ]
    } else {
        [
            ("opt-level", "1"),
            ("debug", "2"),
            ("debug-assertions", "true"),
        ]
    };
    let name = if o.release { "release" } else { "dev" };
    let pins = profile.iter().chain(&[
        ("panic", "\"abort\""),
        ("lto", "false"),
        ("codegen-units", "16"),
        ("overflow-checks", "false"),
        ("incremental", "false"),
    ]);
    for (key, value) in pins {
        cmd.arg("--config")
            .arg(format!("profile.{name}.{key}={value}"));
    }
}

/// Cargo's output directory of `o`'s builds: TARGET_DIR/ARCH-activm-std/PROFILE.
fn out_dir(o: &Options) -> PathBuf {
    o.target_dir
        .join(std_target(o.arch))
        .join(profile_dir(o.release))
}

/// The newest `libactivm_std-*.rlib` in `deps`.
fn runtime_rlib(deps: &Path) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(deps).map_err(|e| format!("{}: {e}", deps.display()))?;
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libactivm_std-") && name.ends_with(".rlib")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .ok_or_else(|| format!("no libactivm_std rlib in {}", deps.display()))
}

/// `cargo xtask app ARGS`: builds and prints the ELF's path.
pub(crate) fn app(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    install_toolchain()?;
    let elf = build(&o)?;
    println!("{}", elf.display());
    Ok(())
}

/// This repository's std guests ([`STD_APPS`] and [`STD_TEST_APPS`]) as build options for
/// `arch`, each into guests/target.
fn std_apps(arch: GuestArch, release: bool) -> impl Iterator<Item = Options> {
    let root = repo_root();
    let programs = STD_APPS.iter().map(|app| (*app, None));
    let tests = STD_TEST_APPS
        .iter()
        .map(|(app, test)| (*app, Some(test.to_string())));
    programs.chain(tests).map(move |(app, test)| Options {
        project: root.join("guests/apps").join(app),
        release,
        arch,
        bin: None,
        test,
        target_dir: root.join("guests/target"),
    })
}

/// Builds this repository's std guests ([`STD_APPS`]) for `arch` and returns their ELF paths.
pub(crate) fn build_std_apps(arch: GuestArch, release: bool) -> Result<Vec<PathBuf>, String> {
    std_apps(arch, release).map(|o| build(&o)).collect()
}

/// Runs clippy (`-D warnings`) over this repository's std guests for `arch`: the programs
/// `build_std_apps` builds, each linted as `build` compiles it (dev profile, as `cargo clippy`).
pub(crate) fn clippy_std_apps(arch: GuestArch) -> Result<(), String> {
    std_apps(arch, false).try_for_each(|o| clippy(&o))
}

/// What the `cargo rustc` of a project's program does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Builds the guest ELF.
    Build,
    /// Checks the program with clippy-driver (as `cargo clippy` does) and builds nothing.
    Clippy,
}

/// Builds activm-std for `o` (step 1) and returns the `cargo rustc` command of the project's
/// program (step 2), ending in rustc arguments: a caller may add more.
fn program_command(o: &Options, action: Action) -> Result<Command, String> {
    let root = repo_root();
    let mut runtime = guest_cargo();
    runtime.current_dir(&o.project).arg("build").arg("--quiet");
    runtime
        .arg("--manifest-path")
        .arg(root.join("guest-std/Cargo.toml"));
    shared_args(&mut runtime, o);
    println!("xtask: building activm-std for {}", o.project.display());
    run(&mut runtime)?;
    let rlib = runtime_rlib(&out_dir(o).join("deps"))?;

    let mut program = guest_cargo();
    program.current_dir(&o.project).arg("rustc");
    if action == Action::Clippy {
        // `cargo rustc` in check mode, the project's own crates compiled by clippy-driver:
        // `cargo clippy` itself cannot hand the runtime to the program alone.
        program.args(["--profile", "check"]);
        program.env("RUSTC_WORKSPACE_WRAPPER", GUEST_CLIPPY_DRIVER);
        // The rustc arguments (`-D warnings`) reach the program only: cargo fails on a warning
        // of the project's build script too.
        program.args(["-Zwarnings", "--config", "build.warnings=\"deny\""]);
    }
    program
        .arg("--manifest-path")
        .arg(o.project.join("Cargo.toml"));
    if let Some(bin) = &o.bin {
        program.args(["--bin", bin]);
    }
    if let Some(test) = &o.test {
        program.args(["--test", test]);
    }
    shared_args(&mut program, o);
    if action == Action::Build {
        program.arg("--message-format=json-render-diagnostics");
    }
    // Cargo does not track an `--extern` it was handed: a stamp of the runtime's build in the
    // flags (which cargo does fingerprint) relinks the program when activm-std changes.
    let stamp = std::fs::metadata(&rlib)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    program
        .args(["--", "-Zunstable-options", "--extern"])
        .arg(format!("force:activm_std={}", rlib.display()))
        .arg("--cfg")
        .arg(format!("activm_std_build=\"{stamp}\""))
        .arg("--check-cfg")
        .arg("cfg(activm_std_build, values(any()))")
        .arg("-L")
        .arg(format!(
            "native={}",
            root.join(link_script_dir(o.arch)).display()
        ));
    Ok(program)
}

/// Lints the project's program with clippy, warnings denied.
fn clippy(o: &Options) -> Result<(), String> {
    let mut program = program_command(o, Action::Clippy)?;
    program.args(["-D", "warnings"]);
    println!("xtask: clippy {}", o.project.display());
    run(&mut program)
}

fn build(o: &Options) -> Result<PathBuf, String> {
    let mut program = program_command(o, Action::Build)?;
    println!("xtask: building {}", o.project.display());
    let out = program
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| {
            format!(
                "cannot run {}: {e}",
                program.get_program().to_string_lossy()
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "building {} failed: {}",
            o.project.display(),
            out.status
        ));
    }
    let elf = stdout
        .lines()
        .filter_map(|line| line.split("\"executable\":\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .next_back()
        .ok_or_else(|| format!("{}: cargo built no executable", o.project.display()))?;
    let mut elf = PathBuf::from(elf);
    if o.test.is_some() {
        // cargo names a test binary `deps/NAME-HASH`: a copy under the project's name is stable.
        let name = o.project.file_name().ok_or("project path has no name")?;
        let stable = out_dir(o).join(name);
        std::fs::copy(&elf, &stable).map_err(|e| format!("{}: {e}", stable.display()))?;
        elf = stable;
    }
    check_elf(o.arch, &elf)?;
    Ok(elf)
}
