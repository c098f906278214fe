//! Finds crossbeam-channel's `tests/` in cargo's registry source (the version Cargo.toml pins)
//! and writes `$OUT_DIR/suite.rs`: one `#[path = ".../tests/FILE.rs"] mod FILE;` per test file.
//! The files are compiled as they are; none is copied into this repository.

use std::path::{Path, PathBuf};

const CRATE: &str = "crossbeam-channel-0.5.17";

/// crossbeam-channel's test files, each a module of the one test binary. All but `golang.rs`,
/// whose `#[global_allocator]` (a counting wrapper of `System`) cannot link next to the
/// allocator activm's runtime brings (a program has one).
const FILES: &[&str] = &[
    "after",
    "array",
    "iter",
    "list",
    "mpsc",
    "never",
    "ready",
    "same_channel",
    "select",
    "select_macro",
    "thread_locals",
    "tick",
    "zero",
];

fn cargo_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME").expect("neither CARGO_HOME nor HOME is set");
    Path::new(&home).join(".cargo")
}

/// `$CARGO_HOME/registry/src/INDEX/crossbeam-channel-VERSION/tests`, for any registry index.
fn tests_dir() -> PathBuf {
    let src = cargo_home().join("registry/src");
    let indexes = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("{}: {e} (has cargo fetched the crates?)", src.display()));
    indexes
        .filter_map(Result::ok)
        .map(|index| index.path().join(CRATE).join("tests"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no {CRATE}/tests under {}", src.display()))
}

fn main() {
    let dir = tests_dir();
    let mut suite = String::new();
    for file in FILES {
        let path = dir.join(format!("{file}.rs"));
        assert!(path.is_file(), "{} is missing", path.display());
        suite += &format!("#[path = {:?}]\nmod {file};\n", path.display().to_string());
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("suite.rs"), suite).expect("cannot write suite.rs");
    // crossbeam's own cfg for its sanitizer runs, which this build never sets.
    println!("cargo::rustc-check-cfg=cfg(crossbeam_sanitize)");
    println!("cargo:rerun-if-changed=build.rs");
}
