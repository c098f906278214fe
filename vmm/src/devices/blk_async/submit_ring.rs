//! The submission ring (`protocol::blk_submit::BlkSubmitRing`): requests without an exit.
//!
//! The guest writes a request into its tag's slot and sets the tag's bit; whoever **looks**
//! ([`Shared::look`]) takes the bits with one atomic swap and starts each request as
//! `blk_submit` would (`request.rs`), its latency counted from the guest's `submitted_at`, every
//! result going through the completion ring. Who looks: the exits of the guest's vCPUs (any
//! hypercall, a kick, a new activation), the disk's timer thread when it wakes, and the
//! **consumer**, a disk thread that sleeps on the doorbell. The consumer never spins for long:
//! after a pass that found nothing it polls for [`SUBMIT_POLL`], then says how the ring will be
//! looked at ([`Shared::announce`]): `LOOKING` while the timer thread will wake before a request
//! made now is due (its earlier requests wait for their latency, and exits look meanwhile), else
//! `SLEEPING` (then it looks at the bits once more and sleeps on the doorbell's eventfd). The
//! guest rings the doorbell only when it read `SLEEPING` after publishing its bit (the
//! handshake is explained in `protocol/src/blk_submit.rs`). The doorbell is an ioeventfd on its
//! slot in the hypercall page (KVM signals the eventfd, no exit to the VMM); the `blk_doorbell`
//! hypercall and a store that does reach the VMM write the same eventfd.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvm_ioctls::{IoEventAddress, VmFd};
use vmm_sys_util::eventfd::EventFd;

use protocol::blk::BLK_OK;
use protocol::blk_submit::{
    blk_doorbell_address, BlkSubmission, BlkSubmitRing, BLK_CONSUMER_AWAKE, BLK_CONSUMER_LOOKING,
    BLK_CONSUMER_SLEEPING, BLK_DOORBELL_RING,
};

use super::{ring_field, AsyncQueue, Shared, State};
use crate::arch::current::abi::HYPERCALL_BASE;
use crate::guest::Guest;
use crate::memory::{GuestRam, Plan};
use crate::vm::Outcome;

/// How long the consumer looks for more requests after a pass before it sleeps (each look is
/// one load; a request that comes meanwhile needs no doorbell). None: the two processors of this
/// machine are the vCPUs', and polls of 20 and 50 us saved few doorbells in `iobench serve`
/// (requests there come ~100 us apart: 250-330 consumer wake-ups per 400 requests either way).
pub const SUBMIT_POLL: Duration = Duration::from_micros(0);

/// The doorbell's eventfd, registered with KVM as an ioeventfd on the doorbell's slot when the
/// host allows it (else the guest's store exits and `ring` is called from the exit).
pub(super) fn new_doorbell(vm: &VmFd) -> std::io::Result<(EventFd, bool)> {
    let fd = EventFd::new(0)?;
    let registered = vm
        .register_ioevent(
            &fd,
            &IoEventAddress::Mmio(blk_doorbell_address(HYPERCALL_BASE)),
            BLK_DOORBELL_RING,
        )
        .is_ok();
    Ok((fd, registered))
}

/// Where a submission ring may lie: 64-byte aligned in guest RAM at or above the image.
pub fn check_ring_address(plan: &Plan, gpa: u64) -> Result<(), String> {
    let size = size_of::<BlkSubmitRing>() as u64;
    let inside = gpa >= plan.image.start
        && gpa
            .checked_add(size)
            .is_some_and(|end| end <= plan.mem_size);
    if !inside || !gpa.is_multiple_of(64) {
        return Err(format!(
            "submission ring {gpa:#x}+{size} is not 64-byte aligned in guest RAM at or above {:#x}",
            plan.image.start
        ));
    }
    Ok(())
}

/// One request taken from the submission ring: the raw `blk_submit` arguments, tag last, and
/// the guest's `submitted_at`.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    pub args: [u64; 4],
    pub submitted_at: u64,
}

/// Take the bits the guest submitted in the ring at `ring` (checked by
/// [`check_ring_address`]) and read their slots, in tag order. Nothing in them is checked yet.
pub fn take_submissions(ram: &GuestRam, ring: u64) -> Result<Vec<Taken>, String> {
    let word = ram
        .atomic_u64(ring_field(ring, offset_of!(BlkSubmitRing, submitted)))
        .map_err(|e| e.to_string())?;
    let mut bits = word.swap(0, Ordering::AcqRel);
    let mut taken = Vec::with_capacity(bits.count_ones() as usize);
    while bits != 0 {
        let tag = u64::from(bits.trailing_zeros());
        bits &= bits - 1;
        let slot = ring_field(ring, offset_of!(BlkSubmitRing, slots))
            + tag * size_of::<BlkSubmission>() as u64;
        let req: BlkSubmission = ram.read_struct(slot).map_err(|e| e.to_string())?;
        taken.push(Taken {
            args: [req.sector, req.gpa, req.op_count, tag],
            submitted_at: req.submitted_at,
        });
    }
    Ok(taken)
}

impl AsyncQueue {
    /// `blk_submit_ring_setup(gpa)`: `Err` is a protocol violation.
    pub fn setup_submit_ring(&self, guest: &Guest, gpa: u64) -> Result<u64, String> {
        check_ring_address(&guest.plan, gpa)?;
        let mut state = self.shared.lock();
        if state.ring.is_none() {
            return Err("no completion ring: call blk_ring_setup first".into());
        }
        if state.submit_ring.is_some() {
            return Err("the submission ring is set up already".into());
        }
        if self.shared.doorbell.get().is_none() {
            return Err("this disk takes no submission ring (its consumer did not start)".into());
        }
        let submitted = submitted_word(guest, gpa)?.load(Ordering::Acquire);
        if submitted != 0 {
            return Err(format!(
                "the submission ring's submitted bits are {submitted:#x}, not 0"
            ));
        }
        consumer_word(guest, gpa)?.store(BLK_CONSUMER_AWAKE, Ordering::SeqCst);
        state.submit_ring = Some(gpa);
        state.last_look = Some(Instant::now());
        // The consumer wakes (the doorbell below) and announces.
        state.consumer_awake = true;
        state.announced = Some(BLK_CONSUMER_AWAKE);
        let _ = self.shared.submit_gpa.set(gpa);
        drop(state);
        self.ring_doorbell();
        Ok(BLK_OK)
    }

    /// The doorbell, rung through an exit (`blk_doorbell`, or a store KVM did not take).
    pub fn ring_doorbell(&self) {
        self.shared.ring_doorbell();
    }
}

impl Shared {
    pub(super) fn ring_doorbell(&self) {
        if let Some(fd) = self.doorbell.get() {
            // Cannot fail short of a counter at u64::MAX - 1: the consumer is awake then.
            let _ = fd.write(1);
        }
    }
}

fn submitted_word(guest: &Guest, ring: u64) -> Result<&std::sync::atomic::AtomicU64, String> {
    guest
        .ram
        .atomic_u64(ring_field(ring, offset_of!(BlkSubmitRing, submitted)))
        .map_err(|e| e.to_string())
}

fn consumer_word(guest: &Guest, ring: u64) -> Result<&std::sync::atomic::AtomicU32, String> {
    guest
        .ram
        .atomic_u32(ring_field(ring, offset_of!(BlkSubmitRing, consumer)))
        .map_err(|e| e.to_string())
}

impl Shared {
    /// Take what the guest submitted since the last look and start it (`at_exit`: from an exit
    /// of one of its vCPUs that goes to its scheduler next): whether there was any. `Err` is a
    /// protocol violation.
    pub(super) fn look(&self, guest: &Arc<Guest>, at_exit: bool) -> Result<bool, String> {
        let Some(&ring) = self.submit_gpa.get() else {
            return Ok(false);
        };
        if !pending(guest, ring) {
            return Ok(false);
        }
        let (taken, since) = {
            let mut state = self.lock();
            let taken = take_submissions(&guest.ram, ring)?;
            let now = Instant::now();
            (taken, state.last_look.replace(now).unwrap_or(now))
        };
        let (now_tsc, now) = (crate::rdtsc(), Instant::now());
        for t in &taken {
            let submitted = submitted_instant(t.submitted_at, now_tsc, now, since, guest.tsc_khz);
            self.start_request(guest, t.args, Some((submitted, at_exit)))
                .map_err(|why| format!("malformed block submission (tag {}): {why}", t.args[3]))?;
            if let Some(disk) = &guest.disk {
                disk.stats.ring_submitted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(!taken.is_empty())
    }

    /// Say in the ring how it will be looked at while the consumer sleeps (the caller holds the
    /// queue's lock): `LOOKING` if something looks at it by `deadline` (the timer thread's)
    /// and that is soon enough for a request made now (its latency, plus the grace busy vCPUs
    /// get), else `SLEEPING`. `true`: it just said `SLEEPING` and bits were set meanwhile (the
    /// guest saw another word and rang nothing): the caller has the consumer take them.
    pub(super) fn announce(
        &self,
        state: &mut State,
        guest: &Guest,
        deadline: Option<Instant>,
    ) -> bool {
        let Some(&ring) = self.submit_gpa.get() else {
            return false;
        };
        if state.consumer_awake {
            return false;
        }
        let latency = guest.disk.as_ref().map_or(Duration::ZERO, |d| d.latency());
        let soon = Instant::now() + latency + super::timer::busy_grace(state, guest);
        let looks = deadline.is_some_and(|at| at <= soon);
        let word = if looks {
            BLK_CONSUMER_LOOKING
        } else {
            BLK_CONSUMER_SLEEPING
        };
        if state.announced == Some(word) {
            return false;
        }
        let Ok(consumer) = consumer_word(guest, ring) else {
            return false;
        };
        // Store, then look at the bits (the guest ORs its bit, then loads this word).
        consumer.store(word, Ordering::SeqCst);
        state.announced = Some(word);
        if looks {
            return false;
        }
        fence(Ordering::SeqCst);
        pending(guest, ring)
    }
}

/// When a request stamped `stamp` (the guest's counter, 0: unknown) was made, seen at the look
/// at `now` (`now_tsc`) that followed the one at `since`: never before `since` (it was not
/// there then) nor after `now`.
fn submitted_instant(stamp: u64, now_tsc: u64, now: Instant, since: Instant, khz: u64) -> Instant {
    if stamp == 0 || khz == 0 {
        return now;
    }
    let ticks = now_tsc.saturating_sub(stamp);
    let age = Duration::from_nanos(
        (u128::from(ticks) * 1_000_000 / u128::from(khz)).min(u128::from(u64::MAX)) as u64,
    );
    now.checked_sub(age).unwrap_or(since).clamp(since, now)
}

/// Whether the guest published bits since the last swap (one load).
fn pending(guest: &Guest, ring: u64) -> bool {
    submitted_word(guest, ring).is_ok_and(|w| w.load(Ordering::SeqCst) != 0)
}

/// The body of the consumer thread.
pub(super) fn consumer_thread(shared: &Shared, weak: &Weak<Guest>) {
    let Some(doorbell) = shared.doorbell.get() else {
        shared.lock().workers -= 1;
        return;
    };
    loop {
        let ring = {
            let mut state = shared.lock();
            if state.closed {
                state.workers -= 1;
                return;
            }
            state.submit_ring
        };
        if let (Some(ring), Some(guest)) = (ring, weak.upgrade()) {
            if guest.outcome().is_none() && !pass(shared, &guest, ring) {
                continue;
            }
            // The guest's `Arc` is not held while asleep: its end closes this queue and rings.
        }
        // Blocks until the doorbell (or the queue's end) adds to the counter.
        let _ = doorbell.read();
        if let (Some(ring), Some(guest)) = (ring, weak.upgrade()) {
            awake(shared, &guest, ring);
            if let Some(disk) = &guest.disk {
                disk.stats.consumer_wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The consumer is awake: it says so (no doorbell while it is).
fn awake(shared: &Shared, guest: &Guest, ring: u64) {
    let mut state = shared.lock();
    state.consumer_awake = true;
    state.announced = Some(BLK_CONSUMER_AWAKE);
    if let Ok(word) = consumer_word(guest, ring) {
        word.store(BLK_CONSUMER_AWAKE, Ordering::SeqCst);
    }
}

/// One pass: start what was submitted, poll briefly, then announce how the ring will be looked
/// at. Whether the consumer may sleep now (`false`: look again at once).
fn pass(shared: &Shared, guest: &Arc<Guest>, ring: u64) -> bool {
    match shared.look(guest, false) {
        Ok(true) => return false,
        Ok(false) => {}
        Err(why) => {
            guest.finish(Outcome::fault(0, why));
            return true;
        }
    }
    let until = Instant::now() + SUBMIT_POLL;
    while Instant::now() < until {
        if pending(guest, ring) {
            return false;
        }
        std::hint::spin_loop();
    }
    let mut state = shared.lock();
    state.consumer_awake = false;
    // An awake timer thread looks before it sleeps (and then announces itself).
    let timer = if state.timer_asleep {
        state.timer_wakes_at
    } else {
        Some(Instant::now())
    };
    if shared.announce(&mut state, guest, timer) {
        drop(state);
        awake(shared, guest, ring);
        return false;
    }
    true
}
