//! hermit-abi's `iovec`, and the loop that `readv` and `writev` share.

/// hermit-abi's `iovec`.
#[repr(C)]
#[derive(Debug)]
pub struct Iovec {
    pub base: *mut u8,
    pub len: usize,
}

/// Moves each of the `iovcnt` buffers at `iov` in order with `transfer` (one `read` or `write`
/// of a buffer), stopping at a short transfer: the rest would go out of order (a socket took
/// part of a write) or find nothing (a read reached the end). Returns the bytes moved, or the
/// first error when nothing moved.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs, each describing memory `transfer` may read or write.
pub unsafe fn each_iovec(
    iov: *const Iovec,
    iovcnt: usize,
    mut transfer: impl FnMut(*mut u8, usize) -> isize,
) -> isize {
    let mut total = 0isize;
    for i in 0..iovcnt {
        // SAFETY: the caller passes `iovcnt` iovecs.
        let v = unsafe { &*iov.add(i) };
        let n = transfer(v.base, v.len);
        if n < 0 {
            return if total > 0 { total } else { n };
        }
        total += n;
        if (n as usize) < v.len {
            break;
        }
    }
    total
}
