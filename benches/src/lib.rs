//! Shared pieces of activm's benchmarks: statistics, the platform floor, guest lookup.

pub mod floor;
pub mod modes;
pub mod plot;
pub mod stats;
pub mod threads;

use std::path::{Path, PathBuf};

/// The repository root, found at run time: the nearest directory at or above the current one
/// whose `Cargo.toml` is a `[workspace]` with `xtask` among its members. (`cargo bench` runs a
/// benchmark in its package directory, `benches/`.) Exits with status 2 outside a checkout.
pub fn repo_root() -> PathBuf {
    let is_root = |dir: &Path| {
        std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|toml| toml.contains("[workspace]") && toml.contains("\"xtask\""))
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    match cwd.ancestors().find(|dir| is_root(dir)) {
        Some(root) => root.to_path_buf(),
        None => {
            eprintln!(
                "no activm workspace at or above {}: run the benchmarks with `cargo xtask bench`",
                cwd.display()
            );
            std::process::exit(2);
        }
    }
}

/// Where `cargo xtask build-guests` puts the guest ELFs (or `ACTIVM_GUEST_DIR`).
fn guest_dir() -> PathBuf {
    std::env::var_os("ACTIVM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("guests/target/x86_64-activm/release"))
}

/// The guest ELF `name`, if it has been built.
pub fn guest_path(name: &str) -> Option<PathBuf> {
    let path = guest_dir().join(name);
    path.is_file().then_some(path)
}

/// The guest ELF `name`; exits with a hint when it has not been built.
pub fn guest(name: &str) -> PathBuf {
    let path = guest_dir().join(name);
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

/// Run `configs` as guests of one activm monitor with `options`, each with a captured console;
/// returns what each printed, or, if one did not exit with status 0, its outcome and name and
/// the last line it printed.
pub fn run_captured(
    configs: &[activm::VmConfig],
    options: &activm::MonitorOptions,
) -> Result<Vec<String>, String> {
    let consoles: Vec<Captured> = configs.iter().map(|_| Captured::default()).collect();
    let boxed = consoles
        .iter()
        .map(|c| Box::new(c.clone()) as Box<dyn std::io::Write + Send>)
        .collect();
    let reports = activm::run_guests(configs, boxed, options).map_err(|e| e.to_string())?;
    for ((report, console), config) in reports.iter().zip(&consoles).zip(configs) {
        if report.outcome != activm::Outcome::Exited(0) {
            return Err(format!(
                "{}: {:?}: {}",
                config.image.display(),
                report.outcome,
                console.text().lines().last().unwrap_or("")
            ));
        }
    }
    Ok(consoles.iter().map(Captured::text).collect())
}

/// A sparse 64 MiB disk image in the temporary directory, removed when dropped.
#[derive(Debug)]
pub struct TempDisk(pub PathBuf);

impl TempDisk {
    pub fn new(stem: &str) -> Result<TempDisk, String> {
        let path = std::env::temp_dir().join(format!("{stem}-{}.img", std::process::id()));
        std::fs::File::create(&path)
            .and_then(|file| file.set_len(64 << 20))
            .map_err(|e| format!("cannot create the disk image {}: {e}", path.display()))?;
        Ok(TempDisk(path))
    }
}

impl Drop for TempDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
