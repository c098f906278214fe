//! Descriptor controls std asks for that activm does not provide: every such `sys_*` call
//! fails with `ENOSYS` and std reports an `io::Error` ("Function not implemented", raw OS
//! error 38). Console I/O lives in [`crate::sys`], files in [`crate::fs`], sockets in
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
    // Descriptors (files are in `crate::fs`; socket `dup` and `poll` in `crate::socket_dup`
    // and `crate::socket_poll`).
    sys_fcntl,
    sys_eventfd,
    // Name resolution: `getaddrinfo` is in `crate::socket_names`.
    sys_getaddrbyname,
);

/// `int sys_ioctl(int s, int cmd, void *argp)`: `FIONBIO` on sockets; `-ENOSYS` otherwise.
///
/// # Safety
/// `argp` is what `cmd` expects.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_ioctl(fd: i32, cmd: i32, argp: *mut u8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { crate::socket::ioctl(fd, cmd, argp) }.unwrap_or_else(|| fail(ENOSYS))
}
