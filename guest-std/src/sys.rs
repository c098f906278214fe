//! Time, memory, entropy, console I/O and exit.

use alloc::alloc::{alloc, alloc_zeroed, dealloc, realloc};
use core::alloc::Layout;
use core::time::Duration;

use activm_rt::rt;
use activm_stub::protocol::boot::BOOT_FLAG_WALL_CLOCK;

use crate::errno::{fail, EBADF, EINVAL, ENOSYS};
use crate::iovec::{each_iovec, Iovec};

/// hermit-abi's `timespec` (`tv_nsec` is an `i32` there).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Timespec {
    pub tv_sec: i64,
    pub tv_nsec: i32,
}

impl Timespec {
    /// The duration it denotes, if valid (non-negative, `tv_nsec` below a second).
    pub fn duration(&self) -> Option<Duration> {
        let secs = u64::try_from(self.tv_sec).ok()?;
        let nanos = u32::try_from(self.tv_nsec)
            .ok()
            .filter(|&n| n < 1_000_000_000)?;
        Some(Duration::new(secs, nanos))
    }
}

const CLOCK_REALTIME: i32 = 1;
const CLOCK_MONOTONIC: i32 = 4;
const STDIN: i32 = 0;
const STDOUT: i32 = 1;
const STDERR: i32 = 2;
/// `abort` (and a panic, which std turns into one) ends the guest with 128 + SIGABRT, as a
/// host process would report it.
const ABORT_STATUS: i32 = 134;

/// Nanoseconds since the guest started, from the TSC (aarch64: the virtual counter, CNTVCT_EL0).
pub fn monotonic_ns() -> u64 {
    rt::ticks_to_ns(rt::rdtsc())
}

/// Nanoseconds since the UNIX epoch: the host's wall clock at boot (`BootInfo::wall_clock_ns`
/// at counter reading `wall_clock_tsc`) plus the counter's time since. A VMM that passes no
/// wall clock leaves the monotonic clock, which starts near the epoch.
pub fn realtime_ns() -> u64 {
    let info = activm_stub::boot_info();
    let now = rt::rdtsc();
    if !info.has(BOOT_FLAG_WALL_CLOCK) {
        return rt::ticks_to_ns(now);
    }
    let (wall, at) = (info.wall_clock_ns, info.wall_clock_tsc);
    if now >= at {
        wall.saturating_add(rt::ticks_to_ns(now - at))
    } else {
        // A vCPU whose counter lags the one the VMM read by a few ticks.
        wall.saturating_sub(rt::ticks_to_ns(at - now))
    }
}

/// `int sys_clock_gettime(clockid_t clock, timespec *tp)`: `CLOCK_MONOTONIC` counts from the
/// TSC; `CLOCK_REALTIME` is the host's wall clock at boot plus the TSC's time since
/// ([`realtime_ns`]).
///
/// # Safety
/// `tp` is null or points to a writable `timespec`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_clock_gettime(clock: i32, tp: *mut Timespec) -> i32 {
    let ns = match clock {
        _ if tp.is_null() => return fail(EINVAL),
        CLOCK_REALTIME => realtime_ns(),
        CLOCK_MONOTONIC => monotonic_ns(),
        _ => return fail(EINVAL),
    };
    let t = Timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i32,
    };
    // SAFETY: the caller passes a writable timespec.
    unsafe { tp.write(t) };
    0
}

fn layout(size: usize, align: usize) -> Option<Layout> {
    Layout::from_size_align(size.max(1), align.max(1)).ok()
}

/// `u8 *sys_malloc(usize size, usize align)`: from the guest heap; null on failure.
#[unsafe(no_mangle)]
pub extern "C" fn sys_malloc(size: usize, align: usize) -> *mut u8 {
    // SAFETY: `layout` has a non-zero size.
    layout(size, align).map_or(core::ptr::null_mut(), |l| unsafe { alloc(l) })
}

/// `u8 *sys_alloc(usize size, usize align)`: as `sys_malloc`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_alloc(size: usize, align: usize) -> *mut u8 {
    sys_malloc(size, align)
}

/// `u8 *sys_alloc_zeroed(usize size, usize align)`: zeroed memory from the guest heap.
#[unsafe(no_mangle)]
pub extern "C" fn sys_alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    // SAFETY: `layout` has a non-zero size.
    layout(size, align).map_or(core::ptr::null_mut(), |l| unsafe { alloc_zeroed(l) })
}

/// `u8 *sys_realloc(u8 *ptr, usize size, usize align, usize new_size)`.
///
/// # Safety
/// `ptr` came from these allocation functions with `size` and `align`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_realloc(
    ptr: *mut u8,
    size: usize,
    align: usize,
    new_size: usize,
) -> *mut u8 {
    match layout(size, align) {
        // SAFETY: the caller's block has this layout.
        Some(l) => unsafe { realloc(ptr, l, new_size.max(1)) },
        None => core::ptr::null_mut(),
    }
}

/// `void sys_free(u8 *ptr, usize size, usize align)`.
///
/// # Safety
/// `ptr` came from these allocation functions with `size` and `align`, and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_free(ptr: *mut u8, size: usize, align: usize) {
    if let (false, Some(l)) = (ptr.is_null(), layout(size, align)) {
        // SAFETY: the caller's block has this layout.
        unsafe { dealloc(ptr, l) };
    }
}

/// `void sys_dealloc(u8 *ptr, usize size, usize align)`: as `sys_free`.
///
/// # Safety
/// As `sys_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_dealloc(ptr: *mut u8, size: usize, align: usize) {
    // SAFETY: forwarded.
    unsafe { sys_free(ptr, size, align) }
}

/// `int sys_getpagesize(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_getpagesize() -> i32 {
    4096
}

/// `int sys_mmap(usize size, u32 prot, u8 **ret)`, `sys_munmap`, `sys_mprotect`: no virtual
/// memory management in the guest.
#[unsafe(no_mangle)]
pub extern "C" fn sys_mmap(_size: usize, _prot: u32, _ret: *mut *mut u8) -> i32 {
    fail(ENOSYS)
}

/// See [`sys_mmap`].
#[unsafe(no_mangle)]
pub extern "C" fn sys_munmap(_ptr: *mut u8, _size: usize) -> i32 {
    fail(ENOSYS)
}

/// See [`sys_mmap`].
#[unsafe(no_mangle)]
pub extern "C" fn sys_mprotect(_ptr: *mut u8, _size: usize, _prot: u32) -> i32 {
    fail(ENOSYS)
}

/// `isize sys_read_entropy(u8 *buf, usize len, u32 flags)`: fills `buf` from activm-rt's
/// ChaCha20 generator, seeded from the host's `getrandom(2)` (`activm_rt::random`). Returns
/// `len`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_read_entropy(buf: *mut u8, len: usize, _flags: u32) -> isize {
    if buf.is_null() {
        return fail(EINVAL) as isize;
    }
    // SAFETY: the caller passes `len` writable bytes.
    activm_rt::random::fill(unsafe { core::slice::from_raw_parts_mut(buf, len) });
    len as isize
}

/// `isize sys_write(int fd, const u8 *buf, usize len)`: stdout and stderr go to the console
/// (one stream); files to the VMM ([`crate::fs`]); stdin and negative descriptors are `-EBADF`.
///
/// # Safety
/// `buf` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_write(fd: i32, buf: *const u8, len: usize) -> isize {
    if crate::eventfd::in_range(fd) {
        // SAFETY: the caller's contract.
        return unsafe { crate::eventfd::write(fd, buf, len) };
    }
    if crate::socket::is_socket(fd) {
        // SAFETY: the caller's contract.
        return unsafe { crate::socket::sys_send(fd, buf, len, 0) };
    }
    if fd > STDERR {
        // SAFETY: forwarded.
        return unsafe { crate::fs::write(fd, buf, len) };
    }
    if fd != STDOUT && fd != STDERR {
        return fail(EBADF) as isize;
    }
    if len > 0 {
        // SAFETY: the caller passes `len` readable bytes.
        activm_stub::console::write_bytes(unsafe { core::slice::from_raw_parts(buf, len) });
    }
    len as isize
}

/// `isize sys_writev(int fd, const iovec *iov, usize iovcnt)`.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs of readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_writev(fd: i32, iov: *const Iovec, iovcnt: usize) -> isize {
    // SAFETY: the caller passes `iovcnt` iovecs of readable memory, which `sys_write` reads.
    unsafe { each_iovec(iov, iovcnt, |base, len| sys_write(fd, base, len)) }
}

/// `isize sys_read(int fd, u8 *buf, usize len)`: stdin is empty (0, end of file); sockets and
/// files are read from the VMM ([`crate::socket`], [`crate::fs`]); stdout and stderr are
/// `-EBADF`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_read(fd: i32, buf: *mut u8, len: usize) -> isize {
    if crate::eventfd::in_range(fd) {
        // SAFETY: the caller's contract.
        return unsafe { crate::eventfd::read(fd, buf, len) };
    }
    if crate::socket::is_socket(fd) {
        // SAFETY: the caller passes `len` writable bytes.
        return unsafe { crate::socket::sys_recv(fd, buf, len, 0) };
    }
    if fd > STDERR {
        // SAFETY: forwarded.
        return unsafe { crate::fs::read(fd, buf, len) };
    }
    if fd == STDIN {
        0
    } else {
        fail(EBADF) as isize
    }
}

/// `isize sys_readv(int fd, const iovec *iov, usize iovcnt)`: as `sys_read`.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_readv(fd: i32, iov: *const Iovec, iovcnt: usize) -> isize {
    if (crate::socket::is_socket(fd) || crate::eventfd::in_range(fd)) && iovcnt > 0 {
        // SAFETY: the caller passes `iovcnt` iovecs of writable memory; the first is read into.
        let v = unsafe { &*iov };
        // SAFETY: the first iovec is writable memory (the caller's contract).
        return unsafe { sys_read(fd, v.base, v.len) };
    }
    if fd > STDERR {
        // SAFETY: forwarded.
        return unsafe { crate::fs::readv(fd, iov, iovcnt) };
    }
    // SAFETY: a zero-length read touches no memory.
    unsafe { sys_read(fd, core::ptr::null_mut(), 0) }
}

/// `int sys_close(int fd)`: closing the standard streams succeeds; files are closed in the
/// VMM ([`crate::fs`]); negative descriptors are `-EBADF`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_close(fd: i32) -> i32 {
    if crate::eventfd::in_range(fd) {
        return crate::eventfd::close(fd);
    }
    if crate::socket::is_socket(fd) {
        return crate::socket::close(fd);
    }
    if fd > STDERR {
        crate::fs::close(fd)
    } else if fd >= STDIN {
        0
    } else {
        fail(EBADF)
    }
}

/// `void sys_exit(int status)`: ends the guest (every thread) with `status & 0xff`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_exit(status: i32) -> ! {
    activm_stub::exit(status)
}

/// `void sys_abort(void)`: ends the guest with status 134 (std has printed the panic message
/// or the abort reason on stderr).
#[unsafe(no_mangle)]
pub extern "C" fn sys_abort() -> ! {
    activm_stub::exit(ABORT_STATUS)
}
