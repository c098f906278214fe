//! Files for the guest (`protocol::fs`, the `fs_*` hypercalls): the guest's descriptor table
//! and one handler per call, run inside the exit on the vCPU's thread. A call that may wait
//! for the host (a read the page cache cannot serve, an `fsync`) comes back as a [`SlowCall`]
//! instead, which the vCPU runs blocked in the VMM, holding no processor (BLOCKED /
//! UNBLOCKED with activations, `vcpu/handoff.rs`). Paths go through [`super::fs_path`], which keeps every access
//! beneath a mount's host directory. Every guest address is checked against guest RAM at or
//! above the image base; a bad one is `Err` (a protocol violation), a bad path an errno.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use protocol::fs::*;
use protocol::hypercall::Hypercall;

use super::fs_path::{last_errno, Mounts};
use crate::config::MountConfig;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// The mode bits a guest may give what it creates: permissions only. Never setuid, setgid or
/// sticky: the VMM may run as root, and a setuid file in a host directory is a way up for
/// whoever else can reach that directory.
const GUEST_MODE: u32 = 0o777;

/// An `fs_*` result: `Ok(value)` for the guest (`>= 0`, or `-errno`), `Err` a violation.
type FsResult = Result<i64, String>;

/// A started file call: its value for the guest now, or the part that may wait for the host.
#[derive(Debug)]
pub enum Answer {
    Now(i64),
    Slow(SlowCall),
}

/// A file call that may wait for the host, run by a vCPU blocked in the VMM (its arguments
/// were checked when it started).
#[derive(Debug)]
pub struct SlowCall {
    /// Kept open by this call even if the guest closes its descriptor meanwhile.
    file: Arc<OpenFile>,
    op: SlowOp,
}

#[derive(Clone, Copy, Debug)]
enum SlowOp {
    /// `len` bytes into guest RAM at `gpa`, from the file's position.
    Read {
        gpa: u64,
        len: u64,
    },
    Fsync,
}

impl SlowCall {
    /// Run it, waiting as long as the host takes: the guest's value (`>= 0`, or `-errno`).
    pub fn perform(&self, mem: &GuestMem) -> i64 {
        match self.op {
            SlowOp::Read { gpa, len } => read_into(mem, &self.file, gpa, len),
            // SAFETY: fsync on a descriptor this call holds open.
            SlowOp::Fsync => host(unsafe { libc::fsync(self.file.fd.as_raw_fd()) }.into()),
        }
    }
}

/// An ordinary `read` of `len` bytes at the file's position into guest RAM at `gpa` (checked
/// when the call started): the count, or `-errno`.
fn read_into(mem: &GuestMem, file: &OpenFile, gpa: u64, len: u64) -> i64 {
    let mut buf = vec![0u8; len as usize];
    // SAFETY: `buf` is `len` writable bytes.
    let n = unsafe { libc::read(file.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return neg(last_errno());
    }
    match mem.write(gpa, &buf[..n as usize]) {
        Ok(()) => n as i64,
        Err(_) => neg(libc::EFAULT),
    }
}

/// One open guest descriptor.
#[derive(Debug)]
struct OpenFile {
    fd: OwnedFd,
    /// Opened on a read-only mount (writes are refused before the host sees them).
    read_only: bool,
}

/// A guest's files: its mounts and its descriptor table.
#[derive(Debug, Default)]
pub struct FileSystem {
    mounts: Mounts,
    fds: Mutex<Vec<Option<Arc<OpenFile>>>>,
}

/// Where the guest's buffers may lie, and its memory.
#[derive(Debug)]
pub struct GuestMem<'a> {
    pub ram: &'a GuestRam,
    pub plan: &'a Plan,
}

impl GuestMem<'_> {
    fn check(&self, gpa: u64, len: u64) -> Result<(), String> {
        let inside = gpa >= self.plan.image.start
            && gpa
                .checked_add(len)
                .is_some_and(|end| end <= self.plan.mem_size);
        if inside {
            Ok(())
        } else {
            Err(format!(
                "buffer {gpa:#x}+{len} is not in guest RAM at or above {:#x}",
                self.plan.image.start
            ))
        }
    }

    fn read(&self, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
        self.check(gpa, len)?;
        self.ram.read_bytes(gpa, len).map_err(|e| e.to_string())
    }

    fn write(&self, gpa: u64, bytes: &[u8]) -> Result<(), String> {
        self.check(gpa, bytes.len() as u64)?;
        self.ram.write_bytes(gpa, bytes).map_err(|e| e.to_string())
    }

    /// The NUL-terminated path at `gpa` (without its NUL).
    fn path(&self, gpa: u64) -> Result<Vec<u8>, String> {
        let room = self.plan.mem_size.saturating_sub(gpa).min(FS_PATH_MAX);
        let mut bytes = self.read(gpa, room)?;
        match bytes.iter().position(|&b| b == 0) {
            Some(end) => {
                bytes.truncate(end);
                Ok(bytes)
            }
            None => Err(format!(
                "path at {gpa:#x} has no NUL in its first {room} bytes"
            )),
        }
    }
}

fn neg(errno: i32) -> i64 {
    -i64::from(errno)
}

/// `Ok(value)` of a host call's result, or the guest's `-errno`.
fn host(result: i64) -> i64 {
    if result < 0 {
        neg(last_errno())
    } else {
        result
    }
}

impl FileSystem {
    pub fn open(configs: &[MountConfig]) -> Result<FileSystem, Error> {
        Ok(FileSystem {
            mounts: Mounts::open(configs)?,
            fds: Mutex::new(vec![None; FS_MAX_FDS]),
        })
    }

    /// Run the `fs_*` call `kind` with the raw arguments `a` to its end, slow or not.
    pub fn call(&self, mem: &GuestMem, kind: Hypercall, a: [u64; 4]) -> FsResult {
        Ok(match self.start(mem, kind, a)? {
            Answer::Now(value) => value,
            Answer::Slow(slow) => slow.perform(mem),
        })
    }

    /// Start the `fs_*` call `kind`: its value, or what is left of it if that may wait.
    pub fn start(&self, mem: &GuestMem, kind: Hypercall, a: [u64; 4]) -> Result<Answer, String> {
        match kind {
            Hypercall::FsRead => self.read(mem, a[0], a[1], a[2]),
            Hypercall::FsFsync => Ok(match self.get(a[0]) {
                Some(file) => Answer::Slow(SlowCall {
                    file,
                    op: SlowOp::Fsync,
                }),
                None => Answer::Now(neg(libc::EBADF)),
            }),
            _ => self.call_now(mem, kind, a).map(Answer::Now),
        }
    }

    /// The calls done inside the exit.
    fn call_now(&self, mem: &GuestMem, kind: Hypercall, a: [u64; 4]) -> FsResult {
        match kind {
            Hypercall::FsOpen => self.fs_open(mem, a[0], a[1] as u32, (a[1] >> 32) as u32),
            Hypercall::FsClose => Ok(self.close(a[0])),
            Hypercall::FsWrite => self.write(mem, a[0], a[1], a[2]),
            Hypercall::FsSeek => Ok(self.with_fd(a[0], |f| {
                if a[2] > FS_SEEK_END {
                    return neg(libc::EINVAL);
                }
                // SAFETY: lseek on a descriptor we own; whence is 0, 1 or 2.
                host(unsafe { libc::lseek(f.fd.as_raw_fd(), a[1] as i64, a[2] as i32) })
            })),
            Hypercall::FsFstat => {
                mem.check(a[1], size_of::<FsStat>() as u64)?;
                self.with_fd_mem(a[0], |f| stat_into(mem, &f.fd, a[1]))
            }
            Hypercall::FsStat => self.stat(mem, a[0], a[1], a[2]),
            Hypercall::FsGetdents => self.getdents(mem, a[0], a[1], a[2]),
            Hypercall::FsMkdir => self.in_parent(mem, a[0], |dir, name| {
                let mode = a[1] as u32 & GUEST_MODE;
                // SAFETY: a directory descriptor and a NUL-terminated name without `/`.
                unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }
            }),
            Hypercall::FsUnlink => {
                let flags = if a[1] == FS_UNLINK_DIR {
                    libc::AT_REMOVEDIR
                } else {
                    0
                };
                self.in_parent(mem, a[0], |dir, name| {
                    // SAFETY: as mkdirat.
                    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }
                })
            }
            Hypercall::FsRename => self.rename(mem, a[0], a[1]),
            other => Err(format!("{} is not a file call", other.name())),
        }
    }

    fn get(&self, fd: u64) -> Option<Arc<OpenFile>> {
        let slot = usize::try_from(fd.checked_sub(FS_FIRST_FD)?).ok()?;
        let table = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        table.get(slot)?.clone()
    }

    fn with_fd(&self, fd: u64, op: impl FnOnce(&OpenFile) -> i64) -> i64 {
        match self.get(fd) {
            Some(file) => op(&file),
            None => neg(libc::EBADF),
        }
    }

    fn with_fd_mem(&self, fd: u64, op: impl FnOnce(&OpenFile) -> FsResult) -> FsResult {
        match self.get(fd) {
            Some(file) => op(&file),
            None => Ok(neg(libc::EBADF)),
        }
    }

    fn install(&self, file: OpenFile) -> i64 {
        let mut table = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        match table.iter().position(Option::is_none) {
            Some(slot) => {
                table[slot] = Some(Arc::new(file));
                slot as i64 + FS_FIRST_FD as i64
            }
            None => neg(libc::EMFILE),
        }
    }

    fn close(&self, fd: u64) -> i64 {
        let Some(slot) = fd
            .checked_sub(FS_FIRST_FD)
            .and_then(|s| usize::try_from(s).ok())
        else {
            return neg(libc::EBADF);
        };
        let mut table = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        // The host descriptor closes when the last call using it ends.
        match table.get_mut(slot).and_then(Option::take) {
            Some(_) => 0,
            None => neg(libc::EBADF),
        }
    }

    fn fs_open(&self, mem: &GuestMem, path: u64, flags: u32, mode: u32) -> FsResult {
        let path = mem.path(path)?;
        if flags & !FS_O_ALL != 0 || flags & FS_O_ACCMODE == FS_O_ACCMODE {
            return Ok(neg(libc::EINVAL));
        }
        let resolved = match self.mounts.resolve(&path) {
            Ok(r) => r,
            Err(errno) => return Ok(neg(errno)),
        };
        let writes = flags & FS_O_ACCMODE != FS_O_RDONLY || flags & (FS_O_CREAT | FS_O_TRUNC) != 0;
        let read_only = resolved.mount.config.read_only;
        if writes && read_only {
            return Ok(neg(libc::EROFS));
        }
        let mut host_flags = match flags & FS_O_ACCMODE {
            FS_O_WRONLY => libc::O_WRONLY,
            FS_O_RDWR => libc::O_RDWR,
            _ => libc::O_RDONLY,
        };
        for (ours, theirs) in [
            (FS_O_CREAT, libc::O_CREAT),
            (FS_O_EXCL, libc::O_EXCL),
            (FS_O_TRUNC, libc::O_TRUNC),
            (FS_O_APPEND, libc::O_APPEND),
            (FS_O_DIRECTORY, libc::O_DIRECTORY),
        ] {
            if flags & ours != 0 {
                host_flags |= theirs;
            }
        }
        // Never block on a FIFO's open, never take a terminal; only files and directories stay
        // (O_NONBLOCK changes nothing for those).
        host_flags |= libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = match resolved
            .mount
            .open_beneath(&resolved.rel, host_flags, mode & GUEST_MODE)
        {
            Ok(fd) => fd,
            Err(errno) => return Ok(neg(errno)),
        };
        match file_type(&fd) {
            Ok(libc::S_IFREG | libc::S_IFDIR) => {}
            Ok(_) => return Ok(neg(libc::ENXIO)),
            Err(errno) => return Ok(neg(errno)),
        }
        Ok(self.install(OpenFile { fd, read_only }))
    }

    /// A read the page cache serves at once is done here (`RWF_NOWAIT`, at the file's
    /// position); one that would wait for the disk is left to [`SlowCall::perform`].
    fn read(&self, mem: &GuestMem, fd: u64, gpa: u64, len: u64) -> Result<Answer, String> {
        io_len(len)?;
        mem.check(gpa, len)?;
        let Some(file) = self.get(fd) else {
            return Ok(Answer::Now(neg(libc::EBADF)));
        };
        let mut buf = vec![0u8; len as usize];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: `iov` describes `buf`, `len` writable bytes; offset -1 is the file's position.
        let n = unsafe { libc::preadv2(file.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
        if n < 0 {
            return Ok(match last_errno() {
                libc::EAGAIN => Answer::Slow(SlowCall {
                    file,
                    op: SlowOp::Read { gpa, len },
                }),
                // RWF_NOWAIT unsupported on this filesystem: an ordinary read, here.
                libc::EOPNOTSUPP => Answer::Now(read_into(mem, &file, gpa, len)),
                errno => Answer::Now(neg(errno)),
            });
        }
        mem.write(gpa, &buf[..n as usize])?;
        Ok(Answer::Now(n as i64))
    }

    fn write(&self, mem: &GuestMem, fd: u64, gpa: u64, len: u64) -> FsResult {
        io_len(len)?;
        let bytes = mem.read(gpa, len)?;
        self.with_fd_mem(fd, |f| {
            if f.read_only {
                return Ok(neg(libc::EBADF));
            }
            // SAFETY: `bytes` is `len` readable bytes.
            let n = unsafe { libc::write(f.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            Ok(host(n as i64))
        })
    }

    fn stat(&self, mem: &GuestMem, path: u64, out: u64, nofollow: u64) -> FsResult {
        let path = mem.path(path)?;
        mem.check(out, size_of::<FsStat>() as u64)?;
        let resolved = match self.mounts.resolve(&path) {
            Ok(r) => r,
            Err(errno) => return Ok(neg(errno)),
        };
        let mut flags = libc::O_PATH;
        if nofollow == FS_STAT_NOFOLLOW {
            flags |= libc::O_NOFOLLOW;
        }
        match resolved.mount.open_beneath(&resolved.rel, flags, 0) {
            Ok(fd) => stat_into(mem, &fd, out),
            Err(errno) => Ok(neg(errno)),
        }
    }

    fn getdents(&self, mem: &GuestMem, fd: u64, gpa: u64, len: u64) -> FsResult {
        io_len(len)?;
        mem.check(gpa, len)?;
        self.with_fd_mem(fd, |f| {
            let mut buf = vec![0u8; len as usize];
            // SAFETY: getdents64 writes at most `len` bytes into `buf`.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    f.fd.as_raw_fd(),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Ok(neg(last_errno()));
            }
            mem.write(gpa, &buf[..n as usize])?;
            Ok(n)
        })
    }

    /// Resolve the path at `gpa` to its parent directory and name, then run `op` on them.
    fn in_parent(
        &self,
        mem: &GuestMem,
        gpa: u64,
        op: impl FnOnce(&OwnedFd, &CStr) -> libc::c_int,
    ) -> FsResult {
        let path = mem.path(gpa)?;
        let outcome = self.mounts.resolve(&path).and_then(|resolved| {
            if resolved.mount.config.read_only {
                return Err(libc::EROFS);
            }
            let (dir, name) = resolved.parent()?;
            Ok(host(op(&dir, &name).into()))
        });
        Ok(outcome.unwrap_or_else(neg))
    }

    fn rename(&self, mem: &GuestMem, from: u64, to: u64) -> FsResult {
        let (from, to) = (mem.path(from)?, mem.path(to)?);
        let outcome = (|| {
            let (a, b) = (self.mounts.resolve(&from)?, self.mounts.resolve(&to)?);
            if a.mount.config.read_only || b.mount.config.read_only {
                return Err(libc::EROFS);
            }
            let ((dir_a, name_a), (dir_b, name_b)) = (a.parent()?, b.parent()?);
            // SAFETY: two directory descriptors and NUL-terminated names without `/`.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    dir_a.as_raw_fd(),
                    name_a.as_ptr(),
                    dir_b.as_raw_fd(),
                    name_b.as_ptr(),
                    0,
                )
            };
            Ok(host(r))
        })();
        Ok(outcome.unwrap_or_else(neg))
    }
}

fn io_len(len: u64) -> Result<(), String> {
    if len > FS_MAX_IO {
        Err(format!("length {len} exceeds the limit of {FS_MAX_IO}"))
    } else {
        Ok(())
    }
}

fn host_stat(fd: &OwnedFd) -> Result<libc::stat, i32> {
    // SAFETY: a zeroed stat is valid; fstat fills it for a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(last_errno());
    }
    Ok(st)
}

fn file_type(fd: &OwnedFd) -> Result<u32, i32> {
    host_stat(fd).map(|st| st.st_mode & libc::S_IFMT)
}

// `st_nlink` and `st_blksize` are narrower on aarch64: the casts are not no-ops there.
#[allow(clippy::unnecessary_cast)]
fn stat_into(mem: &GuestMem, fd: &OwnedFd, out: u64) -> FsResult {
    let st = match host_stat(fd) {
        Ok(st) => st,
        Err(errno) => return Ok(neg(errno)),
    };
    let stat = FsStat {
        dev: st.st_dev,
        ino: st.st_ino,
        nlink: st.st_nlink as u64,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        _pad: 0,
        rdev: st.st_rdev,
        size: st.st_size,
        blksize: st.st_blksize as i64,
        blocks: st.st_blocks,
        atime_sec: st.st_atime,
        atime_nsec: st.st_atime_nsec,
        mtime_sec: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec,
        ctime_sec: st.st_ctime,
        ctime_nsec: st.st_ctime_nsec,
    };
    mem.ram
        .write_struct(out, &stat)
        .map_err(|e| e.to_string())?;
    Ok(0)
}

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;
