//! Files: the hermit-abi file functions std's Hermit port calls, on the VMM's `fs_*`
//! hypercalls (`protocol::fs`), which reach the host directories given with `activm run --mount`.
//! Descriptors 0-2 stay the console's ([`crate::sys`]); the VMM numbers files from 3.
//!
//! Two functions std does not call (its Hermit port has no `rename` nor `fsync`) are provided
//! for programs that declare them: `sys_rename` and `sys_fsync`.

use core::ffi::c_char;

use activm_stub::hypercall::raw;
use activm_stub::protocol::fs::{
    fs_open_arg, FsStat, FS_MAX_IO, FS_O_DIRECTORY, FS_O_RDONLY, FS_STAT_FOLLOW, FS_STAT_NOFOLLOW,
    FS_UNLINK_DIR, FS_UNLINK_FILE,
};
use activm_stub::protocol::hypercall::Hypercall;

use crate::errno::{fail, EINVAL};
use crate::iovec::{each_iovec, Iovec};

/// hermit-abi's `timespec` inside `stat` (`tv_nsec` is an `i32`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StatTime {
    pub tv_sec: i64,
    pub tv_nsec: i32,
}

/// hermit-abi's `stat`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    pub st_dev: u64,
    pub st_ino: u64,
    pub st_nlink: u64,
    pub st_mode: u32,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_rdev: u64,
    pub st_size: i64,
    pub st_blksize: i64,
    pub st_blocks: i64,
    pub st_atim: StatTime,
    pub st_mtim: StatTime,
    pub st_ctim: StatTime,
}

/// Issue `fs_*` call `call`; a negative result is recorded as `errno` and returned.
fn fs_call(call: Hypercall, a0: u64, a1: u64, a2: u64) -> i64 {
    // SAFETY: every caller passes live, identity-mapped guest memory for the call's buffers
    // and NUL-terminated paths (the VMM checks them again and stops the guest otherwise).
    let result = unsafe { raw(call as u64, a0, a1, a2, 0) } as i64;
    if result < 0 {
        i64::from(fail((-result) as i32))
    } else {
        result
    }
}

/// `int sys_open(const char *name, int flags, int mode)`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_open(name: *const c_char, flags: i32, mode: i32) -> i32 {
    fs_call(
        Hypercall::FsOpen,
        name as u64,
        fs_open_arg(flags as u32, mode as u32),
        0,
    ) as i32
}

/// `int sys_opendir(const char *name)`: `open(name, O_RDONLY | O_DIRECTORY)`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_opendir(name: *const c_char) -> i32 {
    let flags = fs_open_arg(FS_O_RDONLY | FS_O_DIRECTORY, 0);
    fs_call(Hypercall::FsOpen, name as u64, flags, 0) as i32
}

/// `close` of a file descriptor (3 and up).
pub fn close(fd: i32) -> i32 {
    fs_call(Hypercall::FsClose, fd as u64, 0, 0) as i32
}

/// `read` of a file descriptor (3 and up), at most [`FS_MAX_IO`] bytes at once.
///
/// # Safety
/// `buf` points to `len` writable bytes.
pub unsafe fn read(fd: i32, buf: *mut u8, len: usize) -> isize {
    let len = (len as u64).min(FS_MAX_IO);
    fs_call(Hypercall::FsRead, fd as u64, buf as u64, len) as isize
}

/// `write` to a file descriptor (3 and up), at most [`FS_MAX_IO`] bytes at once.
///
/// # Safety
/// `buf` points to `len` readable bytes.
pub unsafe fn write(fd: i32, buf: *const u8, len: usize) -> isize {
    let len = (len as u64).min(FS_MAX_IO);
    fs_call(Hypercall::FsWrite, fd as u64, buf as u64, len) as isize
}

/// `readv` of a file descriptor: fills the iovecs in order, stopping at a short read.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs of writable memory.
pub unsafe fn readv(fd: i32, iov: *const Iovec, iovcnt: usize) -> isize {
    // SAFETY: the caller passes `iovcnt` iovecs of writable memory, which `read` fills.
    unsafe { each_iovec(iov, iovcnt, |base, len| read(fd, base, len)) }
}

/// `isize sys_lseek(int fd, isize offset, int whence)`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_lseek(fd: i32, offset: isize, whence: i32) -> isize {
    if whence < 0 {
        return fail(EINVAL) as isize;
    }
    fs_call(Hypercall::FsSeek, fd as u64, offset as u64, whence as u64) as isize
}

fn stat_to_hermit(from: &FsStat) -> Stat {
    let time = |sec: i64, nsec: i64| StatTime {
        tv_sec: sec,
        tv_nsec: nsec as i32,
    };
    Stat {
        st_dev: from.dev,
        st_ino: from.ino,
        st_nlink: from.nlink,
        st_mode: from.mode,
        st_uid: from.uid,
        st_gid: from.gid,
        st_rdev: from.rdev,
        st_size: from.size,
        st_blksize: from.blksize,
        st_blocks: from.blocks,
        st_atim: time(from.atime_sec, from.atime_nsec),
        st_mtim: time(from.mtime_sec, from.mtime_nsec),
        st_ctim: time(from.ctime_sec, from.ctime_nsec),
    }
}

/// Run a stat call into a local `FsStat`, then convert into `out`.
///
/// # Safety
/// `out` is null or points to a writable `Stat`.
unsafe fn stat_with(out: *mut Stat, call: impl FnOnce(u64) -> i64) -> i32 {
    if out.is_null() {
        return fail(EINVAL);
    }
    let mut st = FsStat::default();
    let result = call(&mut st as *mut FsStat as u64);
    if result == 0 {
        // SAFETY: the caller passes a writable stat.
        unsafe { out.write(stat_to_hermit(&st)) };
    }
    result as i32
}

/// `int sys_fstat(int fd, stat *stat)`.
///
/// # Safety
/// `stat` points to a writable `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_fstat(fd: i32, stat: *mut Stat) -> i32 {
    // SAFETY: forwarded.
    unsafe { stat_with(stat, |st| fs_call(Hypercall::FsFstat, fd as u64, st, 0)) }
}

/// `int sys_stat(const char *name, stat *stat)`: follows a final symbolic link.
///
/// # Safety
/// `name` is a NUL-terminated string, `stat` a writable `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_stat(name: *const c_char, stat: *mut Stat) -> i32 {
    let call = |st| fs_call(Hypercall::FsStat, name as u64, st, FS_STAT_FOLLOW);
    // SAFETY: forwarded.
    unsafe { stat_with(stat, call) }
}

/// `int sys_lstat(const char *name, stat *stat)`: a final symbolic link itself.
///
/// # Safety
/// As [`sys_stat`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_lstat(name: *const c_char, stat: *mut Stat) -> i32 {
    let call = |st| fs_call(Hypercall::FsStat, name as u64, st, FS_STAT_NOFOLLOW);
    // SAFETY: forwarded.
    unsafe { stat_with(stat, call) }
}

/// `i64 sys_getdents64(int fd, dirent64 *dirp, usize count)`: as std expects it, **every**
/// remaining entry at once (std reads a directory with one call): records are gathered until
/// the end; when they do not all fit, the directory is rewound and the result is `-EINVAL`,
/// and std retries with a larger buffer. `.` and `..` are listed (std's Hermit port passes
/// them on, and treats a result of 0 as an error: an empty directory would fail otherwise).
///
/// # Safety
/// `dirp` points to `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_getdents64(fd: i32, dirp: *mut u8, count: usize) -> i64 {
    let count = (count as u64).min(FS_MAX_IO);
    let mut filled = 0u64;
    loop {
        let room = count - filled;
        // SAFETY: `filled < count`: the rest of the caller's buffer.
        let at = unsafe { dirp.add(filled as usize) };
        let n = fs_call(Hypercall::FsGetdents, fd as u64, at as u64, room);
        match n {
            0 => return filled as i64,
            n if n > 0 => filled += n as u64,
            n if n == -i64::from(EINVAL) && filled > 0 => {
                // More entries than room: start again with a larger buffer.
                fs_call(Hypercall::FsSeek, fd as u64, 0, 0);
                return i64::from(fail(EINVAL));
            }
            n => return n,
        }
        if filled == count {
            fs_call(Hypercall::FsSeek, fd as u64, 0, 0);
            return i64::from(fail(EINVAL));
        }
    }
}

/// `int sys_mkdir(const char *name, u32 mode)`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_mkdir(name: *const c_char, mode: u32) -> i32 {
    fs_call(Hypercall::FsMkdir, name as u64, u64::from(mode), 0) as i32
}

/// `int sys_unlink(const char *name)`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_unlink(name: *const c_char) -> i32 {
    fs_call(Hypercall::FsUnlink, name as u64, FS_UNLINK_FILE, 0) as i32
}

/// `int sys_rmdir(const char *name)`: an empty directory.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_rmdir(name: *const c_char) -> i32 {
    fs_call(Hypercall::FsUnlink, name as u64, FS_UNLINK_DIR, 0) as i32
}

/// `int sys_rename(const char *old, const char *new)` (activm's; std's Hermit port does not
/// call it: `std::fs::rename` reports "unsupported").
///
/// # Safety
/// Both are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_rename(old: *const c_char, new: *const c_char) -> i32 {
    fs_call(Hypercall::FsRename, old as u64, new as u64, 0) as i32
}

/// `int sys_fsync(int fd)` (activm's; std's Hermit port answers `sync_all` with EINVAL
/// itself).
#[unsafe(no_mangle)]
pub extern "C" fn sys_fsync(fd: i32) -> i32 {
    fs_call(Hypercall::FsFsync, fd as u64, 0, 0) as i32
}
