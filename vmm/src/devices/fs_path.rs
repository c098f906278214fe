//! The guest's mounts (`--mount HOSTDIR:GUESTDIR[:ro]`) and how a guest path becomes a host
//! file: the longest mount whose guest directory holds the path, then `openat2` beneath that
//! mount's directory descriptor with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so `..`,
//! absolute symbolic links and links that lead out are refused by the kernel, race-free.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::config::MountConfig;
use crate::error::Error;

/// An opened mount: its directory as an `O_PATH` descriptor.
#[derive(Debug)]
pub struct Mount {
    pub config: MountConfig,
    dir: OwnedFd,
}

impl Mount {
    pub fn open(config: &MountConfig) -> Result<Mount, Error> {
        let fail = |what: String| {
            Error::Config(format!(
                "--mount {}:{}: {what}",
                config.host.display(),
                config.guest
            ))
        };
        let path = CString::new(config.host.as_os_str().as_encoded_bytes())
            .map_err(|_| fail("the host path holds a NUL byte".into()))?;
        // SAFETY: a NUL-terminated path; the descriptor returned is checked and owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(fail(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let mount = Mount {
            config: config.clone(),
            dir,
        };
        // Every access goes through openat2 (Linux 5.6): without it, refuse the mount now.
        match mount.open_beneath(b".", libc::O_PATH | libc::O_DIRECTORY, 0) {
            Err(libc::ENOSYS) => Err(fail(
                "this kernel lacks openat2 (Linux 5.6 or newer is needed for --mount)".into(),
            )),
            Err(errno) => Err(fail(std::io::Error::from_raw_os_error(errno).to_string())),
            Ok(_) => Ok(mount),
        }
    }

    /// The relative part of `path` if this mount holds it (`.` for the mount's root).
    fn relative<'p>(&self, path: &'p [u8]) -> Option<&'p [u8]> {
        let guest = self.config.guest.as_bytes();
        let rest = if guest == b"/" {
            path.strip_prefix(b"/")?
        } else {
            let rest = path.strip_prefix(guest)?;
            if rest.is_empty() {
                rest
            } else {
                rest.strip_prefix(b"/")?
            }
        };
        Some(if rest.is_empty() { b"." } else { rest })
    }

    /// `openat2(dir, rel, flags | O_CLOEXEC, mode)` beneath this mount.
    pub fn open_beneath(&self, rel: &[u8], flags: i32, mode: u32) -> Result<OwnedFd, i32> {
        open_beneath(self.dir_fd(), rel, flags, mode)
    }

    fn dir_fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.dir.as_fd()
    }
}

/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` relative to `dir`.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &[u8],
    flags: i32,
    mode: u32,
) -> Result<OwnedFd, i32> {
    let rel = CString::new(rel).map_err(|_| libc::EINVAL)?;
    // SAFETY: open_how is plain integers; zero is a valid value of each.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        u64::from(mode & 0o7777)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `rel` is NUL-terminated, `how` a live open_how of the size passed; the result
    // is a fresh descriptor (owned below) or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The calling thread's `errno` after a failed call.
pub fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A guest path resolved to a mount and the path relative to its directory.
#[derive(Debug)]
pub struct Resolved<'a> {
    pub mount: &'a Mount,
    pub rel: Vec<u8>,
}

impl Resolved<'_> {
    /// Split into the parent directory (opened beneath the mount, `O_PATH`) and the last
    /// component, for calls that act on a name in a directory (mkdir, unlink, rename).
    /// The mount's root itself has no parent here: `Err(EBUSY)`.
    pub fn parent(&self) -> Result<(OwnedFd, CString), i32> {
        let rel = trim_trailing_slashes(&self.rel);
        let (parent, name): (&[u8], &[u8]) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (b".", rel),
        };
        match name {
            b"" | b"." => return Err(libc::EBUSY),
            b".." => return Err(libc::EXDEV),
            _ => {}
        }
        let dir = self.mount.open_beneath(
            if parent.is_empty() { b"." } else { parent },
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        let name = CString::new(name).map_err(|_| libc::EINVAL)?;
        Ok((dir, name))
    }
}

fn trim_trailing_slashes(rel: &[u8]) -> &[u8] {
    let mut end = rel.len();
    while end > 1 && rel[end - 1] == b'/' {
        end -= 1;
    }
    &rel[..end]
}

/// The guest's mounts, longest guest directory first.
#[derive(Debug, Default)]
pub struct Mounts(Vec<Mount>);

impl Mounts {
    pub fn open(configs: &[MountConfig]) -> Result<Mounts, Error> {
        let mut mounts = configs
            .iter()
            .map(Mount::open)
            .collect::<Result<Vec<_>, _>>()?;
        refuse_read_only_inside_writable(configs)?;
        mounts.sort_by_key(|m| std::cmp::Reverse(m.config.guest.len()));
        Ok(Mounts(mounts))
    }

    /// The mount holding the absolute guest `path`: `Err(ENOENT)` for a relative or unmapped
    /// path (the guest has no working directory).
    pub fn resolve(&self, path: &[u8]) -> Result<Resolved<'_>, i32> {
        if !path.starts_with(b"/") {
            return Err(libc::ENOENT);
        }
        self.0
            .iter()
            .find_map(|mount| {
                mount.relative(path).map(|rel| Resolved {
                    mount,
                    rel: rel.to_vec(),
                })
            })
            .ok_or(libc::ENOENT)
    }
}

/// A read-only mount whose host directory lies inside a read-write mount's is refused: the
/// guest would write it through the other mount (`/data/./ro/x` is the read-write mount's
/// `ro/x`, since a guest path picks its mount by its spelling).
fn refuse_read_only_inside_writable(configs: &[MountConfig]) -> Result<(), Error> {
    let real = |c: &MountConfig| {
        std::fs::canonicalize(&c.host)
            .map_err(|e| Error::Config(format!("--mount {}: {e}", c.host.display())))
    };
    for ro in configs.iter().filter(|c| c.read_only) {
        for rw in configs.iter().filter(|c| !c.read_only) {
            if real(ro)?.starts_with(real(rw)?) {
                return Err(Error::Config(format!(
                    "--mount {}:{}:ro lies inside the read-write mount {}:{}, through which \
                     the guest could write it",
                    ro.host.display(),
                    ro.guest,
                    rw.host.display(),
                    rw.guest
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_to_the_longest_mount() {
        let dir = std::env::temp_dir();
        let cfg = |guest: &str| MountConfig {
            host: dir.clone(),
            guest: guest.into(),
            read_only: false,
        };
        let mounts = Mounts::open(&[cfg("/data"), cfg("/data/in"), cfg("/r")]).unwrap();
        let rel = |p: &[u8]| {
            mounts
                .resolve(p)
                .map(|r| (r.mount.config.guest.clone(), r.rel))
        };
        assert_eq!(rel(b"/data/in/x"), Ok(("/data/in".into(), b"x".to_vec())));
        assert_eq!(rel(b"/data/inx"), Ok(("/data".into(), b"inx".to_vec())));
        assert_eq!(rel(b"/data"), Ok(("/data".into(), b".".to_vec())));
        assert_eq!(rel(b"/datax").err(), Some(libc::ENOENT));
        assert_eq!(rel(b"data/x").err(), Some(libc::ENOENT));
        assert_eq!(
            rel(b"/data/../etc"),
            Ok(("/data".into(), b"../etc".to_vec()))
        );
    }

    /// A read-only mount inside a read-write one would be writable through it
    /// (`/data/./ro/x`): refused at setup; the other way round is fine.
    #[test]
    fn a_read_only_mount_inside_a_writable_one_is_refused() {
        let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/activm-mounts").unwrap();
        let inner = dir.as_path().join("ro");
        std::fs::create_dir(&inner).unwrap();
        let cfg = |host: &std::path::Path, guest: &str, read_only| MountConfig {
            host: host.to_path_buf(),
            guest: guest.into(),
            read_only,
        };
        let nested = [
            cfg(dir.as_path(), "/data", false),
            cfg(&inner, "/data/ro", true),
        ];
        let err = Mounts::open(&nested).unwrap_err().to_string();
        assert!(err.contains("lies inside the read-write mount"), "{err}");
        // Spelled with `..` on the host side, still inside.
        let dotted = inner.join("..").join("ro");
        let nested = [cfg(&dotted, "/r", true), cfg(dir.as_path(), "/w", false)];
        assert!(Mounts::open(&nested).is_err());
        let fine = [
            cfg(dir.as_path(), "/data", true),
            cfg(&inner, "/data/ro", false),
        ];
        assert!(Mounts::open(&fine).is_ok());
        let both_ro = [
            cfg(dir.as_path(), "/data", true),
            cfg(&inner, "/data/ro", true),
        ];
        assert!(Mounts::open(&both_ro).is_ok());
    }
}
