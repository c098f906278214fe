//! Seccomp filters, one per thread kind (built with `seccompiler`). A system call outside a
//! thread's list raises SIGSYS (SECCOMP_RET_TRAP); the reporter prints the thread's kind and
//! the call's number and ends activm with [`super::EXIT_SECCOMP`]. `openat` is refused with
//! EACCES instead of trapping: the C library opens files on its own (malloc reads
//! /proc/sys/vm/overcommit_memory) and copes with a refusal.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use super::ThreadKind;
use crate::arch::current::seccomp as arch;

/// What every thread needs: memory, locks, signals, time, thread exit, stderr.
const BASE: &[libc::c_long] = &[
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_futex,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    // Binding a granted vCPU's thread to its processor's host CPU (allocator/place.rs), from
    // whichever thread grants it.
    libc::SYS_sched_setaffinity,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_getrandom,
    libc::SYS_write,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    // Moving a disk timer thread's deadline (`devices/blk_async/timer.rs`): from vCPU and disk
    // threads, and from whichever thread drops the disk.
    libc::SYS_timerfd_settime,
];

/// The calls a kind may make besides `BASE`; `ioctl` is listed apart ([`may_ioctl`]).
pub fn extra_calls(kind: ThreadKind) -> &'static [libc::c_long] {
    match kind {
        ThreadKind::Main => &[
            libc::SYS_statx,
            libc::SYS_newfstatat,
            libc::SYS_unlinkat,
            arch::LEGACY_UNLINK,
            libc::SYS_fsync,
            libc::SYS_lseek,
        ],
        ThreadKind::Vcpu => &[
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_preadv2,
            libc::SYS_pwritev2,
            libc::SYS_fdatasync,
            libc::SYS_fsync,
            libc::SYS_timer_create,
            libc::SYS_timer_settime,
            libc::SYS_timer_gettime,
            libc::SYS_timer_delete,
            // Files in the guest's mounts (devices/fs.rs).
            libc::SYS_openat2,
            libc::SYS_read,
            libc::SYS_lseek,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_getdents64,
            libc::SYS_mkdirat,
            libc::SYS_unlinkat,
            libc::SYS_renameat2,
            // Guest sockets (`devices/net.rs`); `socket` itself: see `allow_list`.
            libc::SYS_connect,
            libc::SYS_accept4,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_shutdown,
            libc::SYS_setsockopt,
            libc::SYS_getsockopt,
            libc::SYS_epoll_ctl,
            // A socket's readiness now (`net` op `poll`, zero timeout).
            libc::SYS_ppoll,
        ],
        ThreadKind::Dispatcher => &[libc::SYS_rt_sigtimedwait],
        ThreadKind::Io => &[libc::SYS_writev],
        ThreadKind::Net => &[
            libc::SYS_epoll_pwait,
            // Short waits while the net thread polls the transmit rings.
            libc::SYS_epoll_pwait2,
            libc::SYS_epoll_ctl,
            // Receiving ahead into guest buffers and sending from guest transmit rings
            // (`devices/net/rx.rs`, `devices/net/tx.rs`).
            libc::SYS_recvfrom,
            libc::SYS_sendto,
        ],
        ThreadKind::Disk => &[
            // The submission ring's doorbell (an eventfd).
            libc::SYS_read,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_preadv2,
            libc::SYS_pwritev2,
            libc::SYS_fdatasync,
            libc::SYS_fsync,
        ],
        ThreadKind::Control => &[
            libc::SYS_accept4,
            libc::SYS_accept,
            libc::SYS_getsockopt,
            libc::SYS_setsockopt,
            libc::SYS_read,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_fcntl,
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_prctl,
        ],
    }
}

/// Whether a kind may make KVM ioctls (only the requests `arch::*_ioctls` list).
pub fn may_ioctl(kind: ThreadKind) -> bool {
    kind != ThreadKind::Io
}

/// The allow list of `kind` (openat/open included: [`open_refusal`] answers them).
fn allow_list(kind: ThreadKind) -> Result<BpfProgram, seccompiler::Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BASE
        .iter()
        .chain(extra_calls(kind))
        .chain(&[libc::SYS_openat, arch::LEGACY_OPEN])
        .map(|&nr| (nr, Vec::new()))
        .collect();
    if kind != ThreadKind::Control {
        // Reading a descriptor's flags only (debug builds check a descriptor before closing it).
        let get = |cmd: libc::c_int| -> Result<SeccompRule, seccompiler::Error> {
            let cond =
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, cmd as u64)?;
            Ok(SeccompRule::new(vec![cond])?)
        };
        rules.insert(
            libc::SYS_fcntl,
            vec![get(libc::F_GETFD)?, get(libc::F_GETFL)?],
        );
    }
    if kind == ThreadKind::Vcpu {
        // Outbound guest connections (`--allow-connect`): non-blocking IPv4 TCP sockets only.
        let domain = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::AF_INET as u64,
        )?;
        let kind = SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            (libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64,
        )?;
        rules.insert(
            libc::SYS_socket,
            vec![SeccompRule::new(vec![domain, kind])?],
        );
    }
    // Signals to activm's own threads only (the kick; abort).
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let own = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pid)?;
    rules.insert(libc::SYS_tgkill, vec![SeccompRule::new(vec![own])?]);
    if may_ioctl(kind) {
        let requests = match kind {
            ThreadKind::Vcpu => arch::vcpu_ioctls(),
            _ => arch::other_ioctls(),
        };
        let allowed = requests
            .into_iter()
            .map(|request| {
                let cond =
                    SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)?;
                SeccompRule::new(vec![cond])
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_ioctl, allowed);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        arch::TARGET,
    )?;
    Ok(filter.try_into()?)
}

/// A second filter: `openat`/`open` fail with EACCES. The kernel runs both filters and takes
/// the stronger answer (ERRNO over ALLOW), so these calls are refused, not trapped.
fn open_refusal() -> Result<BpfProgram, seccompiler::Error> {
    let rules = [libc::SYS_openat, arch::LEGACY_OPEN]
        .iter()
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch::TARGET,
    )?;
    Ok(filter.try_into()?)
}

/// Install the filters of `kind` on the calling thread (with PR_SET_NO_NEW_PRIVS).
pub fn install(kind: ThreadKind) -> Result<(), seccompiler::Error> {
    let allow = allow_list(kind)?;
    let refuse = open_refusal()?;
    // The refusal first: installing a filter takes prctl and seccomp, which the allow list
    // itself forbids.
    seccompiler::apply_filter(&refuse)?;
    seccompiler::apply_filter(&allow)
}

/// The SIGSYS handler: report the thread's kind and the system call, then exit.
extern "C" fn report_sigsys(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    // siginfo_t for SIGSYS: si_signo, si_errno, si_code, then (8-aligned) si_call_addr and
    // si_syscall: the call's number is the int at byte 24.
    // SAFETY: the kernel passes a valid siginfo_t; 24 + 4 lies within its 128 bytes.
    let nr = unsafe { *(info as *const u8).add(24).cast::<i32>() };
    let kind = super::current_kind().map_or("unlabelled", ThreadKind::name);
    let mut message = [0u8; 160];
    let mut len = 0;
    for part in ["activm: seccomp: the ", kind, " thread made system call "] {
        len += copy(&mut message[len..], part.as_bytes());
    }
    len += write_decimal(&mut message[len..], nr as i64);
    len += copy(
        &mut message[len..],
        b", which its filter forbids; stopping (exit status 159)\n",
    );
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `message[..len]` is initialised.
    unsafe {
        libc::write(2, message.as_ptr().cast(), len);
        libc::_exit(super::EXIT_SECCOMP);
    }
}

fn copy(to: &mut [u8], from: &[u8]) -> usize {
    let n = from.len().min(to.len());
    to[..n].copy_from_slice(&from[..n]);
    n
}

fn write_decimal(to: &mut [u8], mut value: i64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    let negative = value < 0;
    value = value.abs();
    loop {
        digits[n] = b'0' + (value % 10) as u8;
        n += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    let mut len = 0;
    if negative {
        len += copy(to, b"-");
    }
    for i in (0..n).rev() {
        len += copy(&mut to[len..], &digits[i..=i]);
    }
    len
}

/// Install the SIGSYS reporter (`report_sigsys`), process-wide.
pub fn install_sigsys_reporter() {
    // SAFETY: a zeroed sigaction is valid; the handler has the SA_SIGINFO signature and only
    // makes async-signal-safe calls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = report_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut());
    }
}

/// The sandbox probe: a call no thread kind may make (`socket`), made directly.
pub fn make_forbidden_call() {
    // SAFETY: socket(2) with plain integer arguments; the filter traps it before it runs.
    unsafe {
        libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_builds_a_filter() {
        for kind in [
            ThreadKind::Main,
            ThreadKind::Vcpu,
            ThreadKind::Dispatcher,
            ThreadKind::Io,
            ThreadKind::Disk,
            ThreadKind::Control,
            ThreadKind::Net,
        ] {
            assert!(allow_list(kind).is_ok(), "{kind:?}");
        }
        assert!(open_refusal().is_ok());
    }

    #[test]
    fn decimals_are_written() {
        let mut buf = [0u8; 24];
        let n = write_decimal(&mut buf, 41);
        assert_eq!(&buf[..n], b"41");
        let n = write_decimal(&mut buf, -7);
        assert_eq!(&buf[..n], b"-7");
    }
}
