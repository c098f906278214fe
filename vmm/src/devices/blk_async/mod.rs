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
//! Completions are posted into the guest's ring by whoever comes first: a vCPU of the guest
//! that halts with completions due becomes the **poller** (its thread arms a one-shot kick for
//! the earliest due time, sleeps in KVM like any halt, and on the kick posts what is due and
//! makes the vCPU runnable: no other host thread and no interrupt on the way, like Go's
//! netpoller run by an idle M); else the guest's **timer thread** at the due time (when a
//! poller exists, [`POLLER_GRACE`] later); else the I/O thread that did the work. Those two
//! then interrupt one vCPU the guest marks idle (`SharedHeader::idle_vcpus`), if any: busy
//! vCPUs are never interrupted, they find completions when they schedule.
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
mod unblock;
mod wake;
use queue::{AsyncQueue, Shared, State};
pub use request::parse_request;
pub use submit_ring::{check_ring_address, take_submissions, SUBMIT_POLL};
pub(crate) use wake::wake_one_idle;
use wake::{wake_for_completions, wake_one_running};

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
        self.shared.timer.notify_all();
        self.shared.ring_doorbell();
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
        self.shared.start_request(guest, args, false)
    }

    /// Start the queue's threads: the timer thread and [`IO_THREADS`] I/O threads, each in the
    /// sandbox of a disk thread. Called once the guest exists, before its vCPUs run.
    pub fn start(&self, guest: &Arc<Guest>) -> Result<(), std::io::Error> {
        let (doorbell, _in_kernel) = submit_ring::new_doorbell(&guest.vm)?;
        let _ = self.shared.doorbell.set(doorbell);
        let bodies = [
            timer_thread as fn(&Shared, &Weak<Guest>),
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

    /// The `halt` of vCPU `vcpu` (on its thread): with completions due, it becomes the poller
    /// unless another vCPU is.
    pub fn before_halt(&self, vcpu: u32) {
        let mut state = self.shared.lock();
        let ring = state.delayed.peek().map(|&Reverse((due, _, _))| due);
        let Some(due) = [ring, unblock::earliest(&state)]
            .into_iter()
            .flatten()
            .min()
        else {
            return;
        };
        if state.poller.is_some() {
            return;
        }
        let micros = due.saturating_duration_since(Instant::now()).as_micros();
        if micros >= 1_000_000 {
            return;
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
        let mut state = self.shared.lock();
        post_due(&mut state, guest, Instant::now() + Duration::from_micros(2));
        let tell_timer = timer_must_wake(&state);
        drop(state);
        if tell_timer {
            self.shared.timer.notify_one();
        }
    }

    /// Whether completions wait in the ring that the guest has not consumed.
    pub fn unconsumed(&self, guest: &Guest) -> bool {
        let state = self.shared.lock();
        state.ring.is_some_and(|ring| {
            read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail)))
                .is_ok_and(|tail| tail != state.head)
        })
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
        let mut state = shared.lock();
        let posted = publish(&mut state, &guest, tag, result);
        let tell_timer = timer_must_wake(&state);
        drop(state);
        if tell_timer {
            shared.timer.notify_one();
        }
        if posted {
            fence(Ordering::SeqCst);
            wake_for_completions(&guest);
        }
    }
}

/// The body of the timer thread: posts delayed completions at their due time (later if a
/// halted vCPU polls for them).
fn timer_thread(shared: &Shared, guest: &Weak<Guest>) {
    let mut state = shared.lock();
    loop {
        if state.closed || guest.strong_count() == 0 {
            state.workers -= 1;
            return;
        }
        let grace = |due: Instant| {
            if state.poller.is_some() {
                due + POLLER_GRACE
            } else {
                due
            }
        };
        let due = state.delayed.peek().map(|&Reverse((due, _, _))| grace(due));
        let nudge = state.nudge.map(|(at, _)| at);
        let unblock = unblock::earliest(&state).map(grace);
        let now = Instant::now();
        let earliest = [due, nudge, unblock].into_iter().flatten().min();
        let deadline = earliest.unwrap_or(now + IDLE_CHECK);
        if now < deadline {
            state.timer_wakes_at = earliest;
            state = shared
                .timer
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            state.timer_wakes_at = None;
            continue;
        }
        let Some(guest) = guest.upgrade() else {
            continue;
        };
        let unblocks = unblock::take_due(&mut state, now);
        let posted = post_due(&mut state, &guest, now);
        if (posted || !unblocks.is_empty()) && state.poller.is_some() {
            // The poller's grace ran out (its vCPU lost its processor, or its kick came late):
            // stop waiting for it.
            state.poller = None;
        }
        let nudge_now =
            state.nudge.is_some_and(|(at, _)| at <= now) && nudge_due(&mut state, &guest, now);
        drop(state);
        unblock::deliver(&guest, unblocks);
        if nudge_now {
            fence(Ordering::SeqCst);
            if !wake_one_idle(&guest) {
                wake_one_running(&guest);
            }
        } else if posted {
            fence(Ordering::SeqCst);
            wake_for_completions(&guest);
        }
        drop(guest);
        state = shared.lock();
    }
}

thread_local! {
    /// This vCPU thread's kick timer for polling (created at its first poll).
    static POLL_TIMER: OnceCell<Option<KickTimer>> = const { OnceCell::new() };
    /// This vCPU thread armed its poll timer.
    static POLLING: Cell<bool> = const { Cell::new(false) };
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
    let soon = Instant::now() + Duration::from_micros(2);
    let unblocks = unblock::take_due(&mut state, soon);
    let posted = post_due(&mut state, guest, soon) || !unblocks.is_empty();
    let tell_timer = timer_must_wake(&state);
    drop(state);
    if tell_timer {
        shared.timer.notify_one();
    }
    // This vCPU idles (it halted): its own UNBLOCKED records come to it, with the interrupt.
    unblock::deliver(guest, unblocks);
    if posted
        && guest.vcpus[vcpu as usize]
            .maybe_halted
            .load(Ordering::Relaxed)
    {
        if let Err(e) = crate::arch::current::make_runnable(fd) {
            guest.finish(Outcome::fault(
                vcpu,
                format!("KVM_SET_MP_STATE(RUNNABLE) after an I/O completion: {e}"),
            ));
        }
    }
    // Kicked early (a revoke, another kick): the timer thread covers what is left (it waits
    // for the poller's grace), and the vCPU's next halt polls again.
}

/// Whether the timer thread sleeps past the nudge deadline just set.
fn timer_must_wake(state: &State) -> bool {
    match (state.nudge, state.timer_wakes_at) {
        (Some((at, _)), Some(wakes)) => at < wakes,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Post every delayed completion due by `now`; whether any was.
fn post_due(state: &mut State, guest: &Guest, now: Instant) -> bool {
    let mut posted = false;
    while let Some(&Reverse((due, tag, result))) = state.delayed.peek() {
        if due > now {
            break;
        }
        state.delayed.pop();
        posted |= publish(state, guest, tag, result);
    }
    posted
}

/// Publish `(tag, result)` in the ring (the caller holds the queue's lock); whether it was.
fn publish(state: &mut State, guest: &Guest, tag: u32, result: u64) -> bool {
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
    if state.nudge.is_none() {
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
