//! Socket options the guest may read or set: `TCP_NODELAY`, and `SO_ERROR` to read.

use std::os::fd::RawFd;

use protocol::net::*;

use super::{errno, neg, with_fd, Table};

pub(super) fn so_error(fd: RawFd) -> i32 {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value`/`len` are valid out-parameters for an int option.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        errno()
    } else {
        value
    }
}

pub(super) fn sockopt(table: &Table, s: usize, op: u64, opt: u64, value: u64) -> u64 {
    with_fd(table, s, |fd| match (op, opt) {
        (NET_OP_GETOPT, NET_OPT_ERROR) => so_error(fd) as u64,
        (_, NET_OPT_NODELAY) => {
            let mut v: libc::c_int = i32::from(value != 0);
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let p = (&mut v as *mut libc::c_int).cast();
            // SAFETY: `v`/`len` describe a valid int option buffer.
            let r = unsafe {
                if op == NET_OP_SETOPT {
                    libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, p, len)
                } else {
                    libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, p, &mut len)
                }
            };
            if r < 0 {
                neg(errno())
            } else if op == NET_OP_GETOPT {
                v as u64
            } else {
                0
            }
        }
        _ => neg(libc::ENOPROTOOPT),
    })
}
