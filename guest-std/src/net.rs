//! Files and sockets: not available yet (they need VMM support), so every such `sys_*` call
//! fails with `ENOSYS` and std reports an `io::Error` ("Function not implemented", raw OS
//! error 38). `sys_close` of the standard streams and console I/O live in [`crate::sys`].

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
    sys_ioctl,
    sys_poll,
    sys_eventfd,
    // Sockets and name resolution.
    sys_network_init,
    sys_socket,
    sys_bind,
    sys_listen,
    sys_accept,
    sys_connect,
    sys_recv,
    sys_recvfrom,
    sys_send,
    sys_sendto,
    sys_shutdown,
    sys_shutdown_socket,
    sys_getpeername,
    sys_getsockname,
    sys_getsockopt,
    sys_setsockopt,
    sys_getaddrinfo,
    sys_getaddrbyname,
);

/// `void sys_freeaddrinfo(addrinfo *)`: nothing to free (`sys_getaddrinfo` never succeeds).
#[unsafe(no_mangle)]
pub extern "C" fn sys_freeaddrinfo(_ai: *mut u8) {}
