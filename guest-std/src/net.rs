//! Descriptor controls: `fcntl` and `ioctl` on sockets and eventfds (their `O_NONBLOCK`, what
//! mio sets), and the calls activm does not provide, which fail with `ENOSYS` (std reports an
//! `io::Error`, "Function not implemented", raw OS error 38). Console I/O lives in
//! [`crate::sys`], files in [`crate::fs`], sockets in [`crate::socket`], eventfds in
//! [`crate::eventfd`].

use crate::errno::{fail, EBADF, EINVAL, ENOSYS};

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
    // Name resolution: `getaddrinfo` is in `crate::socket_names`.
    sys_getaddrbyname,
);

/// hermit-abi's `fcntl` commands and flags (Linux's values).
const F_GETFD: i32 = 1;
const F_SETFD: i32 = 2;
const F_GETFL: i32 = 3;
const F_SETFL: i32 = 4;
const O_RDWR: i32 = 0o2;
const O_NONBLOCK: i32 = 0o4000;
const FIONBIO: i32 = 0x8008667eu32 as i32;

/// Whether socket or eventfd `fd` is non-blocking; `None` for other descriptors, `Err(EBADF)`
/// for a closed one.
fn nonblocking(fd: i32) -> Option<Result<bool, i32>> {
    if let Some(s) = crate::socket::socket_number(fd) {
        return Some(Ok(crate::socket_call::nonblocking(s)));
    }
    if crate::socket::is_socket(fd) {
        return Some(Err(EBADF));
    }
    crate::eventfd::slot(fd).map(|_| crate::eventfd::nonblocking(fd))
}

fn set_nonblocking(fd: i32, on: bool) -> i32 {
    if let Some(s) = crate::socket::socket_number(fd) {
        crate::socket_call::set_nonblocking(s, on);
        return 0;
    }
    match crate::eventfd::set_nonblocking(fd, on) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `int sys_fcntl(int fd, int cmd, int arg)` on a socket or eventfd: `F_GETFL` (`O_RDWR`, and
/// `O_NONBLOCK` if set), `F_SETFL` (`O_NONBLOCK` only; other flags are ignored), `F_GETFD` (0)
/// and `F_SETFD` (accepted: there is no `exec`); another command is `EINVAL`. `ENOSYS` for
/// other descriptors.
#[unsafe(no_mangle)]
pub extern "C" fn sys_fcntl(fd: i32, cmd: i32, arg: i32) -> i32 {
    let nonblocking = match nonblocking(fd) {
        None => return fail(if fd < 0 { EBADF } else { ENOSYS }),
        Some(Err(e)) => return fail(e),
        Some(Ok(on)) => on,
    };
    match cmd {
        F_GETFD | F_SETFD => 0,
        F_GETFL => O_RDWR | if nonblocking { O_NONBLOCK } else { 0 },
        F_SETFL => set_nonblocking(fd, arg & O_NONBLOCK != 0),
        _ => fail(EINVAL),
    }
}

/// `int sys_ioctl(int s, int cmd, void *argp)`: `FIONBIO` on sockets and eventfds; `-ENOSYS`
/// otherwise.
///
/// # Safety
/// `argp` is what `cmd` expects.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_ioctl(fd: i32, cmd: i32, argp: *mut u8) -> i32 {
    if crate::eventfd::in_range(fd) {
        if cmd != FIONBIO || argp.is_null() {
            return fail(EINVAL);
        }
        // SAFETY: FIONBIO's argument is an int (the caller's contract).
        let on = unsafe { core::ptr::read_unaligned(argp.cast::<i32>()) } != 0;
        return set_nonblocking(fd, on);
    }
    // SAFETY: the caller's contract.
    unsafe { crate::socket::ioctl(fd, cmd, argp) }.unwrap_or_else(|| fail(ENOSYS))
}
