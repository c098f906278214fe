//! Helpers for activm's own tests: hand-made guest images for the error paths, and temporary
//! paths that clean up after themselves.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A path in the temporary directory, unique to this process and to this call
/// (`activm-test-PID-N-NAME`), removed when dropped, whatever it then is (file, socket or
/// directory tree), so a test leaves nothing behind whether it passes, fails or panics.
/// `TempPath::new` creates nothing: it names a path for something else to create (a trace file,
/// a control socket).
#[derive(Debug)]
pub struct TempPath(PathBuf);

impl TempPath {
    /// A fresh path `activm-test-PID-N-NAME` in the temporary directory; nothing is created.
    pub fn new(name: &str) -> TempPath {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let file = format!("activm-test-{}-{n}-{name}", std::process::id());
        TempPath(std::env::temp_dir().join(file))
    }

    /// A fresh file holding `bytes`.
    pub fn with_contents(name: &str, bytes: &[u8]) -> io::Result<TempPath> {
        let path = TempPath::new(name);
        std::fs::write(&path.0, bytes).map_err(|e| path.error("cannot write", e))?;
        Ok(path)
    }

    /// A fresh sparse file of `len` zero bytes (a disk image).
    pub fn zeroed(name: &str, len: u64) -> io::Result<TempPath> {
        let path = TempPath::new(name);
        let file = std::fs::File::create(&path.0).map_err(|e| path.error("cannot create", e))?;
        file.set_len(len)
            .map_err(|e| path.error("cannot size", e))?;
        Ok(path)
    }

    /// A fresh empty directory; dropping the guard removes it with everything in it.
    pub fn dir(name: &str) -> io::Result<TempPath> {
        let path = TempPath::new(name);
        std::fs::create_dir_all(&path.0).map_err(|e| path.error("cannot create", e))?;
        Ok(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path as a command-line argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("temporary paths are UTF-8")
    }

    fn error(&self, what: &str, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{what} {}: {e}", self.0.display()))
    }
}

impl std::ops::Deref for TempPath {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        // Not following a symbolic link: the guard removes what it names, never a link's target.
        let _ = match std::fs::symlink_metadata(&self.0) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&self.0),
            Ok(_) => std::fs::remove_file(&self.0),
            Err(_) => Ok(()),
        };
    }
}

/// A minimal ELF64 with one PT_LOAD segment holding `code` at `addr`.
pub fn tiny_elf(machine: u16, addr: u64, code: &[u8]) -> Vec<u8> {
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1;
    elf[6] = 1;
    elf[16..18].copy_from_slice(&2u16.to_le_bytes());
    elf[18..20].copy_from_slice(&machine.to_le_bytes());
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[24..32].copy_from_slice(&addr.to_le_bytes());
    elf[32..40].copy_from_slice(&64u64.to_le_bytes());
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    elf[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = 64;
    elf[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
    elf[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes());
    elf[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes());
    elf[ph + 16..ph + 24].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 24..ph + 32].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf.extend_from_slice(code);
    elf
}

/// A raw guest: a valid boot header (ABI `abi_version`) at the image base, followed by `code`,
/// which starts at the entry point `IMAGE_BASE + 64`.
pub fn raw_guest(abi_version: u32, code: &[u8]) -> Vec<u8> {
    use crate::arch::current::{abi::IMAGE_BASE, ELF_MACHINE};
    let mut image = Vec::with_capacity(64 + code.len());
    image.extend_from_slice(&protocol::boot::BOOT_HEADER_MAGIC.to_le_bytes());
    image.extend_from_slice(&abi_version.to_le_bytes());
    image.extend_from_slice(&64u32.to_le_bytes());
    image.extend_from_slice(&(protocol::Arch::CURRENT as u32).to_le_bytes());
    image.extend_from_slice(&0u32.to_le_bytes());
    image.extend_from_slice(&IMAGE_BASE.to_le_bytes());
    image.extend_from_slice(&16u64.to_le_bytes());
    image.extend_from_slice(&[0u8; 24]);
    image.extend_from_slice(code);
    let mut elf = tiny_elf(ELF_MACHINE, IMAGE_BASE, &image);
    // Entry point after the header.
    elf[24..32].copy_from_slice(&(IMAGE_BASE + 64).to_le_bytes());
    elf
}

/// Guest code that crashes the vCPU at once (a triple fault on x86_64).
pub use crate::arch::current::TRIPLE_FAULT_CODE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_paths_are_unique_and_removed_when_dropped() {
        let (a, b) = (TempPath::new("same"), TempPath::new("same"));
        assert_ne!(a.path(), b.path());
        let file = TempPath::with_contents("file", b"bytes").unwrap();
        let disk = TempPath::zeroed("disk", 4096).unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().len(), 4096);
        let dir = TempPath::dir("dir").unwrap();
        std::fs::write(dir.join("inside"), b"x").unwrap();
        let paths: Vec<PathBuf> = [&file, &disk, &dir].map(|p| p.to_path_buf()).into();
        drop((file, disk, dir));
        for path in paths {
            assert!(!path.exists(), "{} is left behind", path.display());
        }
    }
}
