//! Shared pieces of activm's benchmarks: statistics, the platform floor, guest lookup.

pub mod floor;
pub mod stats;
pub mod threads;

use std::path::PathBuf;

/// The guest ELF `name`, if it has been built.
pub fn guest_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("ACTIVM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guests/target/x86_64-activm/release")
        });
    let path = dir.join(name);
    path.is_file().then_some(path)
}

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

/// A guest console that keeps what the guest prints, for benchmarks that run guests in-process.
#[derive(Clone, Debug, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The number after `key=` in `text`, if any.
pub fn field(text: &str, key: &str) -> Option<f64> {
    let at = text.find(&format!("{key}="))? + key.len() + 1;
    let rest = &text[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
