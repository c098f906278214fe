//! Socket options the guest may read or set: `TCP_NODELAY`, and `SO_ERROR` to read.

use std::os::fd::RawFd;

use protocol::net::*;

use super::{errno, neg, with_fd, Table};

/// An int socket option of `fd`; `Err(errno)` when refused.
pub(super) fn int_option(fd: RawFd, level: libc::c_int, name: libc::c_int) -> Result<i32, i32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value`/`len` are valid out-parameters for an int option.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(value)
    }
}

/// Sets an int socket option of `fd`; `Err(errno)` when refused.
pub(super) fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: i32,
) -> Result<(), i32> {
    // SAFETY: `value` is a live int, the option's type, and its size is given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub(super) fn so_error(fd: RawFd) -> i32 {
    int_option(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or_else(|e| e)
}

pub(super) fn sockopt(table: &Table, s: usize, op: u64, opt: u64, value: u64) -> u64 {
    with_fd(table, s, |fd| match (op, opt) {
        (NET_OP_GETOPT, NET_OPT_ERROR) => so_error(fd) as u64,
        (NET_OP_SETOPT, NET_OPT_NODELAY) => {
            let on = i32::from(value != 0);
            match set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, on) {
                Ok(()) => 0,
                Err(e) => neg(e),
            }
        }
        (_, NET_OPT_NODELAY) => match int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY) {
            Ok(v) => v as u64,
            Err(e) => neg(e),
        },
        _ => neg(libc::ENOPROTOOPT),
    })
}
