//! Shared pieces of activm's benchmarks: statistics, the platform floor, guest lookup.

pub mod floor;
pub mod stats;
pub mod threads;

use std::path::PathBuf;

/// Where `cargo xtask build-guests` puts the guest ELFs.
pub fn guest(name: &str) -> PathBuf {
    let dir = std::env::var_os("ACTIVM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guests/target/x86_64-activm/release")
        });
    let path = dir.join(name);
    if !path.is_file() {
        eprintln!(
            "guest {} is missing: run `cargo xtask build-guests` first",
            path.display()
        );
        std::process::exit(2);
    }
    path
}
