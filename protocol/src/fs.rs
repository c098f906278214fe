//! Host directories mapped into a guest (`activm run --mount HOSTDIR:GUESTDIR`), reached through
//! the `fs_*` hypercalls (numbers 64-75).
//!
//! Paths are NUL-terminated UTF-8-or-not byte strings in guest memory, absolute, at most
//! [`FS_PATH_MAX`] bytes with the NUL; a path lies under one mount's guest directory or the call
//! fails with `-ENOENT`. The VMM resolves the rest of the path beneath the mount's host directory
//! and never leaves it: `..` above the mount, absolute symbolic links and links that lead out are
//! refused (`-EXDEV`, `-ELOOP` or `-ENOENT`, as Linux's `openat2(RESOLVE_BENEATH)` says).
//!
//! Results are `i64` in the load's register: `>= 0` on success, `-errno` (Linux numbers) on
//! failure. A buffer, path or stat block outside guest RAM at or above the image base, a path
//! without a NUL in its first [`FS_PATH_MAX`] bytes, or a length above [`FS_MAX_IO`] is a
//! protocol violation that stops the guest (status 125).
//!
//! Descriptors are small integers from [`FS_FIRST_FD`] (0-2 stay the console's), at most
//! [`FS_MAX_FDS`] open at once per guest (`-EMFILE` beyond). Calls complete synchronously inside
//! the exit (a page-cache hit is microseconds; a cold read keeps the vCPU for the host's I/O).

/// The first descriptor `fs_open` returns.
pub const FS_FIRST_FD: u64 = 3;
/// Descriptors a guest may hold open at once.
pub const FS_MAX_FDS: usize = 256;
/// Largest path, NUL included.
pub const FS_PATH_MAX: u64 = 4096;
/// Largest `len` of one `fs_read`, `fs_write` or `fs_getdents` (1 MiB).
pub const FS_MAX_IO: u64 = 1 << 20;

/// `fs_open` flags (Linux and hermit-abi values); any other bit is `-EINVAL`.
pub const FS_O_RDONLY: u32 = 0o0;
pub const FS_O_WRONLY: u32 = 0o1;
pub const FS_O_RDWR: u32 = 0o2;
pub const FS_O_ACCMODE: u32 = 0o3;
pub const FS_O_CREAT: u32 = 0o100;
pub const FS_O_EXCL: u32 = 0o200;
pub const FS_O_TRUNC: u32 = 0o1000;
pub const FS_O_APPEND: u32 = 0o2000;
pub const FS_O_DIRECTORY: u32 = 0o200000;
/// Every flag `fs_open` takes.
pub const FS_O_ALL: u32 =
    FS_O_ACCMODE | FS_O_CREAT | FS_O_EXCL | FS_O_TRUNC | FS_O_APPEND | FS_O_DIRECTORY;

/// `fs_open`'s second argument: the flags and the creation mode (permission bits: the VMM keeps
/// `0o777` of it, never setuid, setgid or sticky).
pub const fn fs_open_arg(flags: u32, mode: u32) -> u64 {
    ((mode as u64) << 32) | flags as u64
}

/// `fs_seek` origins.
pub const FS_SEEK_SET: u64 = 0;
pub const FS_SEEK_CUR: u64 = 1;
pub const FS_SEEK_END: u64 = 2;

/// `fs_stat`'s third argument: follow a final symbolic link (stat) or not (lstat).
pub const FS_STAT_FOLLOW: u64 = 0;
pub const FS_STAT_NOFOLLOW: u64 = 1;

/// `fs_unlink`'s second argument: remove a file or an (empty) directory.
pub const FS_UNLINK_FILE: u64 = 0;
pub const FS_UNLINK_DIR: u64 = 1;

/// What `fs_stat` and `fs_fstat` write (times in seconds and nanoseconds since the UNIX epoch,
/// the host's). `mode` holds the file type (`S_IFMT` bits, Linux values) and permissions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStat {
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub _pad: u32,
    pub rdev: u64,
    pub size: i64,
    pub blksize: i64,
    pub blocks: i64,
    pub atime_sec: i64,
    pub atime_nsec: i64,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
    pub ctime_sec: i64,
    pub ctime_nsec: i64,
}

/// `fs_getdents` fills the buffer with Linux `dirent64` records: `d_ino: u64` at 0, `d_off: i64`
/// at 8, `d_reclen: u16` at 16, `d_type: u8` at 18, the NUL-terminated name from 19, each record
/// `d_reclen` bytes (8-aligned). It returns the bytes written, 0 at the end of the directory, or
/// `-EINVAL` when the next record does not fit.
pub const FS_DIRENT_NAME_OFFSET: usize = 19;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn stat_layout() {
        assert_eq!(size_of::<FsStat>(), 120);
        assert_eq!(offset_of!(FsStat, mode), 24);
        assert_eq!(offset_of!(FsStat, gid), 32);
        assert_eq!(offset_of!(FsStat, rdev), 40);
        assert_eq!(offset_of!(FsStat, size), 48);
        assert_eq!(offset_of!(FsStat, atime_sec), 72);
        assert_eq!(offset_of!(FsStat, mtime_sec), 88);
        assert_eq!(offset_of!(FsStat, ctime_nsec), 112);
    }

    #[test]
    fn values_are_pinned() {
        assert_eq!((FS_FIRST_FD, FS_MAX_FDS, FS_PATH_MAX), (3, 256, 4096));
        assert_eq!(FS_MAX_IO, 1 << 20);
        assert_eq!(FS_O_ALL, 0o203303);
        assert_eq!(
            fs_open_arg(FS_O_CREAT | FS_O_WRONLY, 0o644),
            (0o644 << 32) | 0o101
        );
        assert_eq!((FS_SEEK_SET, FS_SEEK_CUR, FS_SEEK_END), (0, 1, 2));
        assert_eq!((FS_STAT_NOFOLLOW, FS_UNLINK_DIR), (1, 1));
    }
}
