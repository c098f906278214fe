//! Hostile uses of the block submission ring (`protocol::blk_submit`): the VMM's consumer
//! thread reads what the guest wrote and must stop the guest, never trust it.

use core::cell::UnsafeCell;
use core::sync::atomic::Ordering;

use activm_stub::protocol::blk::{BlkRing, BLK_OK};
use activm_stub::protocol::blk_submit::{BlkSubmission, BlkSubmitRing};
use activm_stub::{hypercall, println};

struct Rings(UnsafeCell<(BlkRing, BlkSubmitRing)>);

// SAFETY: only vCPU 0 runs these modes; the VMM reads and writes the rings from its threads.
unsafe impl Sync for Rings {}

static RINGS: Rings = Rings(UnsafeCell::new((BlkRing::new(), BlkSubmitRing::new())));

/// The modes of this module, or `None`.
pub fn mode(mode: &str) -> Option<fn(&str) -> !> {
    match mode {
        "blk-ring-garbage" => Some(garbage),
        "blk-ring-without-completions" => Some(without_completions),
        _ => None,
    }
}

/// A submitted bit whose slot holds an unknown operation: the consumer stops the guest.
fn garbage(mode: &str) -> ! {
    let rings = RINGS.0.get();
    // SAFETY: both rings are statics in the image (64-byte aligned) for the guest's lifetime.
    let setup = unsafe {
        hypercall::blk_ring_setup(&raw const (*rings).0) == BLK_OK
            && hypercall::blk_submit_ring_setup(&raw const (*rings).1) == BLK_OK
    };
    if !setup {
        println!("hostile {mode}: UNEXPECTED: the rings were refused");
        activm_stub::exit(1);
    }
    // SAFETY: slot 5 is written before its bit is set; the VMM only reads it after.
    unsafe {
        (&raw mut (*rings).1.slots[5]).write_volatile(BlkSubmission {
            sector: 0,
            gpa: 0,
            op_count: 7 << 32 | 1,
            submitted_at: 0,
        });
        (*rings).1.submitted.fetch_or(1 << 5, Ordering::SeqCst);
    }
    hypercall::blk_doorbell();
    // The consumer runs on its own thread: give it a few seconds to stop us.
    for _ in 0..20_000_000_000u64 {
        core::hint::spin_loop();
    }
    crate::stopped(mode, 0)
}

/// A submission ring before the completion ring: stopped at the setup.
fn without_completions(mode: &str) -> ! {
    // SAFETY: a static ring in the image; the VMM must refuse it.
    let got = unsafe { hypercall::blk_submit_ring_setup(&raw const (*RINGS.0.get()).1) };
    crate::stopped(mode, got)
}
