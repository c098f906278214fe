//! Files: not available yet (they need VMM support), so every such `sys_*` call fails with
//! `ENOSYS` and std reports an `io::Error` ("Function not implemented", raw OS error 38).
//! `sys_close` of the standard streams and console I/O live in [`crate::sys`]; sockets in
//! [`crate::socket`].

use crate::errno::{fail, ENOSYS};

/// Defines C functions that take any arguments (ignored: the SysV ABI passes them in
/// registers the callee may leave alone) and return `-ENOSYS` (as `isize`, which also reads
/// correctly as an `i32` result).
macro_rules! enosys {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: `-ENOSYS` (not available yet).")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> isize {
            fail(ENOSYS) as isize
        }
    )*};
}

enosys!(
    // Files and directories.
    sys_open,
    sys_opendir,
    sys_unlink,
    sys_rmdir,
    sys_mkdir,
    sys_stat,
    sys_lstat,
    sys_fstat,
    sys_lseek,
    sys_getdents64,
    sys_dup,
    sys_fcntl,
    sys_poll,
    sys_eventfd,
    // Name resolution (numeric addresses need none).
    sys_getaddrinfo,
    sys_getaddrbyname,
);

/// `void sys_freeaddrinfo(addrinfo *)`: nothing to free (`sys_getaddrinfo` never succeeds).
#[unsafe(no_mangle)]
pub extern "C" fn sys_freeaddrinfo(_ai: *mut u8) {}

/// `int sys_ioctl(int s, int cmd, void *argp)`: `FIONBIO` on sockets; `-ENOSYS` otherwise.
///
/// # Safety
/// `argp` is what `cmd` expects.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_ioctl(fd: i32, cmd: i32, argp: *mut u8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { crate::socket::ioctl(fd, cmd, argp) }.unwrap_or_else(|| fail(ENOSYS))
}
