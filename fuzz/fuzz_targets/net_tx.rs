//! A stream's transmit ring as a hostile guest drives it: any ring address, and between the
//! VMM's sends any `head` and `waiter` values, or honest queueing. Checked against a model: the
//! VMM refuses (never panics on) a `head` more than the ring ahead of what it sent or a
//! `waiter` that is not a tag + 1, and what it sends reaches the socket's peer in ring order.

#![no_main]

use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use activm::fuzzing::TxArea;
use activm_fuzz::{Guest, Input, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::net::{NetTx, NET_RING_CAPACITY, NET_TX_BYTES};

fn socket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors; the result is checked.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair");
    // SAFETY: fresh descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn read_u32(guest: &Guest, gpa: u64) -> u32 {
    let b = guest.ram.read_bytes(gpa, 4).expect("in RAM");
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fuzz_target!(|data: &[u8]| {
    static GUEST: OnceLock<Guest> = OnceLock::new();
    let guest = GUEST.get_or_init(|| Guest::new(1));
    let mut input = Input(data);
    let image = guest.plan.image.start;
    let gpa = match input.u8() % 4 {
        0 => input.number(),
        _ => (image + input.u32() as u64 % (MEM_SIZE - image)) & !63,
    };
    let Ok(mut tx) = TxArea::new(&guest.ram, image, gpa) else {
        return;
    };
    let head_at = gpa + offset_of!(NetTx, head) as u64;
    let tail_at = gpa + offset_of!(NetTx, tail) as u64;
    let waiter_at = gpa + offset_of!(NetTx, waiter) as u64;
    let data_at = gpa + offset_of!(NetTx, data) as u64;
    let (ours, peer) = socket_pair();
    let (mut expected, mut got) = (Vec::new(), Vec::new());
    let mut pattern = 0u8;
    while !input.is_empty() {
        let tail = read_u32(guest, tail_at);
        let head = read_u32(guest, head_at);
        match input.u8() % 4 {
            0 => {
                let value = input.u32();
                guest.ram.write_u32(head_at, value).expect("in RAM");
            }
            1 => {
                let value = input.u32() % (NET_RING_CAPACITY as u32 + 2);
                guest.ram.write_u32(waiter_at, value).expect("in RAM");
            }
            2 => {
                // An honest guest queues bytes where there is room.
                let room = NET_TX_BYTES.saturating_sub(head.wrapping_sub(tail) as usize);
                let n = (input.u32() as usize % 4096).min(room);
                for i in 0..n {
                    let at = head.wrapping_add(i as u32) as usize % NET_TX_BYTES;
                    pattern = pattern.wrapping_add(1);
                    guest
                        .ram
                        .write_bytes(data_at + at as u64, &[pattern])
                        .expect("in RAM");
                }
                guest
                    .ram
                    .write_u32(head_at, head.wrapping_add(n as u32))
                    .expect("in RAM");
            }
            _ => {
                let queued = head.wrapping_sub(tail) as usize;
                let waiter = read_u32(guest, waiter_at);
                let result = tx.send(&guest.ram, ours.as_raw_fd());
                if queued > NET_TX_BYTES {
                    assert!(result.is_err(), "head {head} tail {tail} accepted");
                    return;
                }
                let sent = read_u32(guest, tail_at).wrapping_sub(tail) as usize;
                assert!(sent <= queued);
                for i in 0..sent {
                    let at = tail.wrapping_add(i as u32) as usize % NET_TX_BYTES;
                    expected.push(
                        guest
                            .ram
                            .read_bytes(data_at + at as u64, 1)
                            .expect("in RAM")[0],
                    );
                }
                if sent > 0 && waiter as usize > NET_RING_CAPACITY {
                    assert!(result.is_err(), "waiter {waiter} accepted");
                    return;
                }
                let (_, tag) = result.expect("an honest ring is sent");
                if sent > 0 && waiter != 0 {
                    assert_eq!(tag, Some(waiter - 1));
                }
                let mut buf = [0u8; 8192];
                loop {
                    // SAFETY: `buf` is a writable buffer of its length.
                    let n = unsafe {
                        libc::recv(peer.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                    };
                    if n <= 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n as usize]);
                }
                assert_eq!(got, expected[..got.len()], "bytes out of ring order");
            }
        }
    }
});
