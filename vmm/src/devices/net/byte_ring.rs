//! A byte ring in guest memory shared with an untrusted guest: free-running `u32` producer and
//! consumer indices over a data area of a fixed size, with a 64-byte aligned header of atomic
//! words. Nothing here knows about sockets: the receive buffers (`rx.rs`, the VMM produces)
//! and transmit rings (`tx.rs`, the guest produces) both use it, and another device's ring of
//! bytes can too.
//!
//! The guest writes one of the two indices, so every value read from it is hostile input:
//! [`used`] refuses a distance larger than the ring, and [`spans`] only yields ranges inside
//! the data area.

use std::sync::atomic::AtomicU32;

use crate::memory::GuestRam;

/// A ring of `cap` data bytes at `data_offset` in a `size`-byte area at guest address `gpa`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ByteRing {
    gpa: u64,
    end: u64,
    data_offset: usize,
    cap: usize,
}

impl ByteRing {
    /// The area `gpa..gpa + size`, checked to be 64-byte aligned in `ram` at or above
    /// `image_start` (`what` names it in the error, a protocol violation).
    pub(super) fn new(
        ram: &GuestRam,
        image_start: u64,
        what: &str,
        gpa: u64,
        size: usize,
        data_offset: usize,
        cap: usize,
    ) -> Result<ByteRing, String> {
        let inside = gpa >= image_start
            && gpa
                .checked_add(size as u64)
                .is_some_and(|end| end <= ram.size());
        if !inside || !gpa.is_multiple_of(64) || data_offset + cap > size {
            return Err(format!(
                "{what} {gpa:#x}+{size} is not 64-byte aligned in guest RAM at or above {image_start:#x}"
            ));
        }
        Ok(ByteRing {
            gpa,
            end: gpa + size as u64,
            data_offset,
            cap,
        })
    }

    pub(super) fn gpa(&self) -> u64 {
        self.gpa
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// The atomic word at `offset` in the header (`ram`: the RAM `new` checked against).
    pub(super) fn word<'g>(&self, ram: &'g GuestRam, offset: usize) -> &'g AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.data_offset && self.end <= ram.size()
        );
        let ptr = (ram.host_base() + self.gpa + offset as u64) as *mut u32;
        // SAFETY: the area lies in `ram` (checked in `new` and above), mapped while `ram`
        // lives; `offset` is a 4-byte aligned header field of a 64-byte aligned area. The guest
        // accesses these words atomically too.
        unsafe { AtomicU32::from_ptr(ptr) }
    }

    /// The host address of data byte `at` (`at < cap`; `ram`: the RAM `new` checked against).
    pub(super) fn data_at(&self, ram: &GuestRam, at: usize) -> u64 {
        assert!(at < self.cap && self.end <= ram.size());
        ram.host_base() + self.gpa + (self.data_offset + at) as u64
    }
}

/// Bytes between `tail` and `head` in a ring of `cap`; `None` if that is more than `cap`
/// (an index the guest corrupted).
pub(super) fn used(head: u32, tail: u32, cap: usize) -> Option<usize> {
    let used = head.wrapping_sub(tail) as usize;
    (used <= cap).then_some(used)
}

/// The first contiguous piece of `len` bytes starting at free-running position `pos` in a
/// ring of `cap`: `(offset, length)`, never past the end of the data area.
pub(super) fn first_span(pos: u32, len: usize, cap: usize) -> (usize, usize) {
    let at = pos as usize % cap;
    (at, len.min(cap - at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_checked_and_spans_stay_inside() {
        assert_eq!(used(10, 4, 16), Some(6));
        assert_eq!(used(3, u32::MAX - 2, 16), Some(6));
        assert_eq!(used(4, 10, 16), None);
        assert_eq!(used(100, 0, 16), None);
        assert_eq!(first_span(14, 6, 16), (14, 2));
        assert_eq!(first_span(16, 6, 16), (0, 6));
        for pos in [0, 1, 15, 16, u32::MAX] {
            for len in 0..=16 {
                let (at, n) = first_span(pos, len, 16);
                assert!(at + n <= 16 && n <= len);
            }
        }
    }
}
