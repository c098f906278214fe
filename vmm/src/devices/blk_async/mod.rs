//! Asynchronous block requests (`blk_ring_setup`, `blk_submit`; `protocol::blk::BlkRing`).
//!
//! `blk_submit` never blocks the vCPU. A request the page cache serves at once completes inside
//! the exit as before. On a device with `--io-latency` the data still moves inside the exit when
//! the page cache allows, and only the latency is waited for: the completion is *due* then
//! (within the disk's inline wait it is simply waited for in the exit, cheaper than any
//! wake-up: `Disk::start`, `devices/blk.rs`).
//! Requests whose data must wait for the host (a cold read, a flush) go to a pool of
//! [`IO_THREADS`] I/O threads, started with the guest (before the sandbox, which forbids a vCPU
//! thread to create threads). The hypercall returns `BLK_IN_FLIGHT`.
//!
//! Completions are posted into the guest's ring by whoever comes first: a vCPU thread of the
//! guest in an exit it makes anyway once they are due (the next `blk_submit`, a `halt`:
//! `Shared::post_at_exit`); a vCPU of the guest that halts with completions not yet due
//! becomes the **poller** (its thread arms a one-shot kick for the earliest due time, sleeps in
//! KVM like any halt, and on the kick posts what is due and makes the vCPU runnable: no other
//! host thread and no interrupt on the way, like Go's netpoller run by an idle M); else the
//! guest's **timer thread** (`timer.rs`: at the due time, or a grace later when a poller or
//! busy vCPUs will post it); else the I/O thread that did the work. Those two then interrupt
//! one vCPU the guest marks idle (`SharedHeader::idle_vcpus`), if any: busy vCPUs are never
//! interrupted, they find completions when they schedule.
//!
//! Why not BLOCKED / UNBLOCKED: that path takes the blocked thread's whole context out of the
//! vCPU and back (sync regs, XSAVE, two records, a new activation), ~60 us a request here. With a
//! ring the thread only parks in the guest's own scheduler, and the vCPU keeps its processor.

use std::cell::{Cell, OnceCell};
use std::cmp::Reverse;
use std::mem::offset_of;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use protocol::blk::{BlkCompletion, BlkRing, BLK_RING_CAPACITY};

use crate::guest::Guest;
use crate::kick::KickTimer;
use crate::vm::Outcome;

pub mod queue;
mod request;
mod submit_ring;
mod timer;
mod timerfd;
mod unblock;
mod wake;
use queue::{AsyncQueue, Shared, State};
pub use request::parse_request;
pub use submit_ring::{check_ring_address, take_submissions, Taken, SUBMIT_POLL};
pub use timer::BUSY_GRACE;
use timerfd::TimerFd;
use wake::wake_for_completions;
pub(crate) use wake::{wake_one_idle, wake_one_running, want_processor_if_none_held};

/// I/O threads per disk: this many cold reads or flushes wait for the host at once; more queue.
pub const IO_THREADS: usize = 8;
/// How often an idle I/O thread checks that its guest still exists.
const IDLE_CHECK: Duration = Duration::from_millis(200);
/// How long the timer thread leaves a due completion to a halted vCPU polling for it.
const POLLER_GRACE: Duration = Duration::from_micros(300);

impl Drop for AsyncQueue {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
        self.shared.wake_timer_now();
        self.shared.ring_doorbell();
    }
}

impl Shared {
    /// A vCPU thread of the guest is in an exit (the caller holds the queue's lock): post the
    /// delayed completions due by now (its vCPU, or the guest's scheduler it is about to enter,
    /// finds them: nobody is interrupted), move the nudge on if the guest consumed what it
    /// waited for, and re-time the timer thread. Whether any was posted.
    pub(super) fn post_at_exit(&self, state: &mut State, guest: &Guest, busy: bool) -> bool {
        let now = Instant::now();
        let posted = post_due(state, guest, now, false);
        if posted > 0 {
            if let Some(disk) = &guest.disk {
                disk.stats
                    .posted_at_exits
                    .fetch_add(posted as u64, Ordering::Relaxed);
            }
        }
        refresh_nudge(state, guest, now);
        self.retime(state, guest, busy);
        posted > 0
    }
}

fn ring_field(ring: u64, offset: usize) -> u64 {
    ring + offset as u64
}

fn read_u32(guest: &Guest, gpa: u64) -> Result<u32, String> {
    guest
        .ram
        .read_bytes(gpa, 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .map_err(|e| e.to_string())
}

impl AsyncQueue {
    /// `blk_ring_setup(gpa)`: `Err` is a protocol violation.
    pub fn setup(&self, guest: &Guest, gpa: u64) -> Result<u64, String> {
        let size = std::mem::size_of::<BlkRing>() as u64;
        let inside = gpa >= guest.plan.image.start
            && gpa
                .checked_add(size)
                .is_some_and(|end| end <= guest.plan.mem_size);
        if !inside || !gpa.is_multiple_of(64) {
            return Err(format!(
                "completion ring {gpa:#x}+{size} is not 64-byte aligned in guest RAM at or above {:#x}",
                guest.plan.image.start
            ));
        }
        let mut state = self.shared.lock();
        if state.ring.is_some() {
            return Err("the completion ring is set up already".into());
        }
        let tail = read_u32(guest, ring_field(gpa, offset_of!(BlkRing, tail)))?;
        if tail != 0 {
            return Err(format!("the completion ring's tail is {tail}, not 0"));
        }
        guest
            .ram
            .write_u32(ring_field(gpa, offset_of!(BlkRing, head)), 0)
            .map_err(|e| e.to_string())?;
        state.ring = Some(gpa);
        Ok(protocol::blk::BLK_OK)
    }

    /// `blk_submit(sector, gpa, op << 32 | count, tag)`: the result now, or `BLK_IN_FLIGHT`
    /// with the request queued for an I/O thread. `Err` is a protocol violation.
    pub fn submit(&self, guest: &Arc<Guest>, args: [u64; 4]) -> Result<u64, String> {
        self.shared.start_request(guest, args, None)
    }

    /// A vCPU of the guest exits: take what it submitted through the ring meanwhile (one load
    /// when nothing was). `to_scheduler`: the vCPU goes to its scheduler next, which takes the
    /// completion ring (no interrupt, no nudge for what this posts). `Err` is a protocol
    /// violation.
    pub fn look_at_exit(&self, guest: &Arc<Guest>, to_scheduler: bool) -> Result<(), String> {
        self.shared.look(guest, to_scheduler).map(|_| ())
    }

    /// A vCPU of the guest exits on its way to its scheduler (`blk_doorbell`): post what is due.
    pub fn post_due_at_exit(&self, guest: &Guest) {
        let busy = timer::busy(guest, true);
        let mut state = self.shared.lock();
        self.shared.post_at_exit(&mut state, guest, busy);
    }

    /// Start the queue's threads: the timer thread and [`IO_THREADS`] I/O threads, each in the
    /// sandbox of a disk thread. Called once the guest exists, before its vCPUs run.
    pub fn start(&self, guest: &Arc<Guest>) -> Result<(), std::io::Error> {
        let (doorbell, _in_kernel) = submit_ring::new_doorbell(&guest.vm)?;
        let _ = self.shared.doorbell.set(doorbell);
        let _ = self.shared.timer.set(TimerFd::new()?);
        let bodies = [
            timer::timer_thread as fn(&Shared, &Weak<Guest>),
            submit_ring::consumer_thread,
        ]
        .into_iter()
        .chain(std::iter::repeat_n(
            io_thread as fn(&Shared, &Weak<Guest>),
            IO_THREADS,
        ));
        for body in bodies {
            let shared = Arc::clone(&self.shared);
            let weak = Arc::downgrade(guest);
            std::thread::Builder::new()
                .name(format!("g{}-disk", guest.id))
                .spawn(move || {
                    crate::sandbox::enter(crate::sandbox::ThreadKind::Disk);
                    body(&shared, &weak)
                })?;
            self.shared.lock().workers += 1;
        }
        self.shared.lock().started = true;
        Ok(())
    }

    /// The `halt` of vCPU `vcpu` (on its thread): completions due now are posted and the vCPU
    /// does not halt (`true`: it finds them on its way back); with completions due later, it
    /// becomes the poller unless another vCPU is.
    pub fn before_halt(&self, guest: &Guest, vcpu: u32) -> bool {
        let busy = timer::busy(guest, true);
        let mut state = self.shared.lock();
        // Posted now, or by this exit's look at the submission ring.
        if self.shared.post_at_exit(&mut state, guest, busy) || unconsumed(&state, guest) {
            return true;
        }
        if arm_poll(&mut state, vcpu) {
            self.shared.retime(&mut state, guest, false);
        }
        false
    }

    /// When the earliest completion whose data already moved is due (it waits only for the
    /// device's latency): one for the ring, or an UNBLOCKED (`unblock.rs`).
    pub fn earliest_due(&self) -> Option<Instant> {
        let state = self.shared.lock();
        let ring = state.delayed.peek().map(|&Reverse((due, _, _))| due);
        [ring, unblock::earliest(&state)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Post the completions due by now (a new activation of the guest is about to start: it
    /// finds them at once, not when the timer thread gets to run).
    pub fn post_due_now(&self, guest: &Guest) {
        let busy = timer::busy(guest, true);
        let mut state = self.shared.lock();
        let posted = post_due(&mut state, guest, Instant::now(), false);
        if let Some(disk) = &guest.disk {
            disk.stats
                .posted_at_exits
                .fetch_add(posted as u64, Ordering::Relaxed);
        }
        self.shared.retime(&mut state, guest, busy);
    }

    /// Whether completions wait in the ring that the guest has not consumed.
    pub fn unconsumed(&self, guest: &Guest) -> bool {
        unconsumed(&self.shared.lock(), guest)
    }

    /// Requests in flight (for the stall report and tests).
    pub fn in_flight(&self) -> u32 {
        self.shared.lock().in_flight.count_ones()
    }
}

/// The body of an I/O thread: take a request, perform it, post its completion.
fn io_thread(shared: &Shared, guest: &Weak<Guest>) {
    loop {
        let (req, tag) = {
            let mut state = shared.lock();
            loop {
                if state.closed || guest.strong_count() == 0 {
                    state.workers -= 1;
                    return;
                }
                if let Some(job) = state.jobs.pop_front() {
                    break job;
                }
                state.waiting += 1;
                state = shared
                    .work
                    .wait_timeout(state, IDLE_CHECK)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                state.waiting -= 1;
            }
        };
        let Some(guest) = guest.upgrade() else {
            shared.lock().workers -= 1;
            return;
        };
        let result = match &guest.disk {
            Some(disk) => disk.perform_until(&guest.ram, &req, &|| guest.outcome().is_some()),
            None => protocol::blk::BLK_ERR_NO_DEVICE,
        };
        let busy = timer::busy(&guest, false);
        let mut state = shared.lock();
        let posted = publish(&mut state, &guest, tag, result, true);
        if let Some(disk) = &guest.disk {
            disk.stats
                .posted_by_io
                .fetch_add(u64::from(posted), Ordering::Relaxed);
        }
        shared.retime(&mut state, &guest, busy);
        drop(state);
        if posted {
            fence(Ordering::SeqCst);
            wake_for_completions(&guest);
        }
    }
}

thread_local! {
    /// This vCPU thread's kick timer for polling (created at its first poll).
    static POLL_TIMER: OnceCell<Option<KickTimer>> = const { OnceCell::new() };
    /// This vCPU thread armed its poll timer.
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

/// Make halted vCPU `vcpu` (on its thread) the poller for the earliest completion or UNBLOCKED
/// still to come, unless another vCPU is: whether it became it.
fn arm_poll(state: &mut State, vcpu: u32) -> bool {
    let ring = state.delayed.peek().map(|&Reverse((due, _, _))| due);
    let Some(due) = [ring, unblock::earliest(state)].into_iter().flatten().min() else {
        return false;
    };
    if state.poller.is_some() {
        return false;
    }
    // Rounded up: the kick never comes before the due time.
    let micros = due
        .saturating_duration_since(Instant::now())
        .as_nanos()
        .div_ceil(1000);
    if micros >= 1_000_000 {
        return false;
    }
    let armed = POLL_TIMER.with(|t| match t.get_or_init(KickTimer::new) {
        Some(timer) => {
            timer.arm((micros as i64).max(1));
            true
        }
        None => false,
    });
    if armed {
        state.poller = Some(vcpu);
        POLLING.with(|p| p.set(true));
    }
    armed
}

/// A vCPU thread was kicked out of `KVM_RUN`: if it was polling, post what is due and make the
/// vCPU runnable so its guest sees the completions.
pub fn after_kick(guest: &Guest, vcpu: u32, fd: &VcpuFd) {
    if !POLLING.with(|p| p.replace(false)) {
        return;
    }
    let Some(disk) = &guest.disk else { return };
    let shared = &disk.queue.shared;
    let mut state = shared.lock();
    if state.poller == Some(vcpu) {
        state.poller = None;
    }
    let now = Instant::now();
    let unblocks = unblock::take_due(&mut state, now);
    let ring = post_due(&mut state, guest, now, false);
    disk.stats
        .posted_by_poller
        .fetch_add(ring as u64, Ordering::Relaxed);
    let posted = ring > 0 || !unblocks.is_empty();
    let halted = guest.vcpus[vcpu as usize]
        .maybe_halted
        .load(Ordering::Relaxed);
    if !posted && halted {
        // Kicked before anything was due (another kick): still halted, it polls on.
        arm_poll(&mut state, vcpu);
    }
    shared.retime(&mut state, guest, false);
    drop(state);
    // This vCPU idles (it halted): its own UNBLOCKED records come to it, with the interrupt.
    unblock::deliver(guest, unblocks);
    if posted && halted {
        if let Err(e) = crate::arch::current::make_runnable(fd) {
            guest.finish(Outcome::fault(
                vcpu,
                format!("KVM_SET_MP_STATE(RUNNABLE) after an I/O completion: {e}"),
            ));
        }
    }
    // Kicked to run on (a revoke): the timer thread covers what is left, and the vCPU's
    // next halt polls again.
}

/// Whether completions wait in the ring that the guest has not consumed.
fn unconsumed(state: &State, guest: &Guest) -> bool {
    state.ring.is_some_and(|ring| {
        read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail)))
            .is_ok_and(|tail| tail != state.head)
    })
}

/// Post every delayed completion due by `now`; how many were. `nudge`: as for [`publish`].
fn post_due(state: &mut State, guest: &Guest, now: Instant, nudge: bool) -> usize {
    let mut posted = 0;
    while let Some(&Reverse((due, tag, result))) = state.delayed.peek() {
        if due > now {
            break;
        }
        state.delayed.pop();
        posted += usize::from(publish(state, guest, tag, result, nudge));
    }
    posted
}

/// Seen from an exit: if the guest consumed what the nudge waits for, wait for what is left
/// from now on (the timer thread then need not wake for it).
fn refresh_nudge(state: &mut State, guest: &Guest, now: Instant) {
    let (Some((_, head_then)), Some(ring)) = (state.nudge, state.ring) else {
        return;
    };
    let Ok(tail) = read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail))) else {
        return;
    };
    if (head_then.wrapping_sub(tail) as i32) > 0 {
        return; // still unconsumed: the nudge stands
    }
    state.nudge = None;
    if state.head != tail {
        let nudge_us =
            read_u32(guest, ring_field(ring, offset_of!(BlkRing, nudge_us))).unwrap_or(0);
        if nudge_us != 0 {
            let at = now + Duration::from_micros(u64::from(nudge_us.min(1_000_000)));
            state.nudge = Some((at, state.head));
        }
    }
}

/// Publish `(tag, result)` in the ring (the caller holds the queue's lock); whether it was.
///
/// `nudge`: the guest's `nudge_us` applies (a busy vCPU is interrupted if the completion is left
/// unconsumed that long). Not for a completion posted from a vCPU's exit, a new activation or
/// a poll: that vCPU goes to its scheduler, which takes the ring, before it runs a thread.
fn publish(state: &mut State, guest: &Guest, tag: u32, result: u64, nudge: bool) -> bool {
    state.in_flight &= !(1u64 << tag);
    let Some(ring) = state.ring else { return false };
    if guest.outcome().is_some() {
        return false;
    }
    let head = state.head;
    let published = read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail))).and_then(|tail| {
        // Tags bound what is in flight or unconsumed: no room means the guest moved its tail.
        if head.wrapping_sub(tail) as usize >= BLK_RING_CAPACITY {
            return Err(format!(
                "the guest corrupted its block completion ring: no room for a completion (head {head}, tail {tail})"
            ));
        }
        let slot = head as usize % BLK_RING_CAPACITY;
        let entry = ring_field(ring, offset_of!(BlkRing, entries))
            + (slot * std::mem::size_of::<BlkCompletion>()) as u64;
        guest
            .ram
            .write_struct(
                entry,
                &BlkCompletion {
                    tag: u64::from(tag),
                    result,
                },
            )
            .map_err(|e| e.to_string())?;
        // Release: the entry is complete before the new head is visible.
        fence(Ordering::Release);
        guest
            .ram
            .write_u32(ring_field(ring, offset_of!(BlkRing, head)), head.wrapping_add(1))
            .map_err(|e| e.to_string())
    });
    if let Err(why) = published {
        guest.finish(Outcome::fault(0, why));
        return false;
    }
    state.head = head.wrapping_add(1);
    if nudge && state.nudge.is_none() {
        let nudge_us =
            read_u32(guest, ring_field(ring, offset_of!(BlkRing, nudge_us))).unwrap_or(0);
        if nudge_us != 0 {
            state.nudge = Some((
                Instant::now() + Duration::from_micros(u64::from(nudge_us.min(1_000_000))),
                state.head,
            ));
        }
    }
    true
}

/// The nudge deadline passed: whether the guest left completions unconsumed (then it wants a
/// running vCPU interrupted); the next look is set up while some are.
fn nudge_due(state: &mut State, guest: &Guest, now: Instant) -> bool {
    let Some((_, head_then)) = state.nudge.take() else {
        return false;
    };
    let Some(ring) = state.ring else { return false };
    let tail = read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail))).unwrap_or(head_then);
    let nudge_us = read_u32(guest, ring_field(ring, offset_of!(BlkRing, nudge_us))).unwrap_or(0);
    // Unconsumed: the tail has not reached the head of then (free-running indices).
    let late = (head_then.wrapping_sub(tail) as i32) > 0;
    if state.head != tail && nudge_us != 0 {
        let at = now + Duration::from_micros(u64::from(nudge_us.min(1_000_000)));
        state.nudge = Some((at, state.head));
    }
    late
}
