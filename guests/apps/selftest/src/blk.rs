//! `blk-async CASE`: the asynchronous block protocol (`protocol::blk::BlkRing`) driven by hand,
//! correctly (`ok`) and in the ways the VMM must refuse (each stops the guest with status 125).

use alloc::vec;
use core::cell::UnsafeCell;
use core::sync::atomic::Ordering;

use activm_stub::hypercall;
use activm_stub::println;
use activm_stub::protocol::blk::{BlkRing, BLK_IN_FLIGHT, BLK_OK, BLK_OP_READ};

struct Ring(UnsafeCell<BlkRing>);

// SAFETY: only vCPU 0 uses it; the VMM writes it as the protocol says.
unsafe impl Sync for Ring {}

static RING: Ring = Ring(UnsafeCell::new(BlkRing::new()));

fn ring() -> &'static BlkRing {
    // SAFETY: the atomics are the only fields read through this reference.
    unsafe { &*RING.0.get() }
}

fn setup() {
    // SAFETY: the ring is a static, 64-byte aligned, for the guest's lifetime.
    let r = unsafe { hypercall::blk_ring_setup(RING.0.get()) };
    assert_eq!(r, BLK_OK, "blk_ring_setup");
}

/// Submits a one-sector read with `tag` into a fresh buffer; returns the call's result.
fn submit(tag: u64) -> u64 {
    let buf = vec![0u8; 512].leak();
    // SAFETY: the buffer is leaked (never reused) heap memory above the image base.
    unsafe { hypercall::blk_submit(0, buf.as_mut_ptr() as u64, BLK_OP_READ, 1, tag) }
}

pub fn run(case: &str) -> ! {
    match case {
        "ok" => {
            setup();
            let r = submit(5);
            if r != BLK_IN_FLIGHT {
                println!("blk-async: completed at once ({r})");
            } else {
                while ring().head.load(Ordering::Acquire) == 0 {
                    core::hint::spin_loop();
                }
                // SAFETY: entry 0 was written before the head moved past it.
                let e = unsafe { core::ptr::read_volatile(&(*RING.0.get()).entries[0]) };
                ring().tail.store(1, Ordering::Release);
                println!("blk-async: tag {} result {}", e.tag, e.result);
            }
            activm_stub::exit(0)
        }
        "no-ring" => {
            submit(0);
        }
        "bad-tag" => {
            setup();
            submit(64);
        }
        "twice" => {
            setup();
            submit(3);
            submit(3);
        }
        "misaligned" => {
            // SAFETY: the VMM must refuse the address before it writes anything.
            unsafe {
                hypercall::blk_ring_setup((RING.0.get() as *const u8).wrapping_add(8).cast())
            };
        }
        "corrupt-tail" => {
            setup();
            submit(1);
            ring().tail.store(1000, Ordering::Release);
            submit(2);
        }
        _ => println!("blk-async: cases: ok no-ring bad-tag twice misaligned corrupt-tail"),
    }
    panic!("blk-async {case}: the VMM did not stop the guest")
}
