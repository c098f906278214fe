//! The hermit-abi error numbers this crate returns (Linux values, as in hermit-abi's
//! `errno` module), and the per-thread `errno` (`sys_get_errno`).

use core::cell::Cell;

pub const EPERM: i32 = 1;
pub const ESRCH: i32 = 3;
pub const EBADF: i32 = 9;
pub const EAGAIN: i32 = 11;
pub const ENOMEM: i32 = 12;
pub const EFAULT: i32 = 14;
pub const EMFILE: i32 = 24;
pub const EINVAL: i32 = 22;
pub const ENOSYS: i32 = 38;
pub const ETIMEDOUT: i32 = 110;

activm_rt::thread_local! {
    static ERRNO: Cell<i32> = const { Cell::new(0) };
}

/// Records `errno` for the calling thread and returns `-errno`, hermit's error convention.
pub fn fail(errno: i32) -> i32 {
    let _ = ERRNO.try_with(|e| e.set(errno));
    -errno
}

/// `int sys_get_errno(void)`: the calling thread's last error.
#[unsafe(no_mangle)]
pub extern "C" fn sys_get_errno() -> i32 {
    ERRNO.try_with(Cell::get).unwrap_or(0)
}

/// `int sys_errno(void)`: same as `sys_get_errno`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_errno() -> i32 {
    sys_get_errno()
}
