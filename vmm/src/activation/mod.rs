//! The VMM side of scheduler activations: each guest's activation state, the upcall records
//! it writes (`records.rs`, over the one view of the shared area, [`SharedArea`]), and new
//! activations. Where a record goes (which vCPU, with which interrupt) is `delivery.rs`.
//!
//! Every event that changes a guest's processors becomes an [`Event`]. It is written as a
//! record into the upcall queue of a vCPU that is running (other than the one the event is
//! about) and that vCPU gets the upcall interrupt; when none is running the event waits in
//! `pending` and goes out with the next new activation, ahead of nothing but its NEWPROC record
//! (Williams 2002, section 4.1). Sequence numbers are given when a record is written, under the one
//! lock that serialises all writers of the guest's queues, so they are gap-free and ordered.
//!
//! Records left unconsumed in the queue of a vCPU that loses its processor are taken back
//! (that vCPU cannot run its handler) and delivered elsewhere with their sequence numbers, so
//! no event waits on a vCPU that may never run again.

mod records;
mod shared_area;

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use protocol::shared::{UpcallKind, VcpuRunState, UPCALL_QUEUE_CAPACITY};

pub use self::shared_area::SharedArea;
use crate::arch::current::abi::UserContext;
use records::{drain_into, pop_stack, take_back, write_record};

/// Events that have waited longer than this many strong are a guest not consuming its upcalls.
pub const MAX_PENDING: usize = 4 * UPCALL_QUEUE_CAPACITY * protocol::MAX_VCPUS;

/// An event for the guest.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: UpcallKind,
    /// The activation the event is about.
    pub activation: u32,
    /// The vCPU that activation was on.
    pub vcpu: u32,
    pub arg: u64,
    pub context: Option<Box<UserContext>>,
    /// Sequence number, once it has been given one.
    pub seq: u64,
    /// Host TSC when the event happened.
    pub tsc: u64,
}

impl Event {
    pub fn new(kind: UpcallKind, activation: u32, vcpu: u32, arg: u64) -> Event {
        Event {
            kind,
            activation,
            vcpu,
            arg,
            context: None,
            seq: 0,
            tsc: crate::arch::current::timestamp(),
        }
    }
}

/// Why an upcall could not be written.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The queue is full (or its guest-written tail is nonsense).
    Full,
    /// Guest memory refused the write (cannot happen for a planned queue).
    Memory(String),
}

/// Why a new activation could not start.
#[derive(Debug, PartialEq, Eq)]
pub enum StartError {
    /// The guest's stack pool is empty right now; it may refill it.
    NoStack,
    /// A protocol violation.
    Fatal(String),
}

/// A new activation's start.
#[derive(Clone, Copy, Debug)]
pub struct NewActivation {
    pub entry: u64,
    pub stack_top: u64,
    pub activation: u32,
    /// The yielded activation its NEWPROC names (0: none).
    pub previous_yielded: u32,
}

#[derive(Debug)]
pub(crate) struct State {
    /// `sa_register`ed entry point.
    entry: Option<u64>,
    enabled: bool,
    next_seq: u64,
    next_activation: u32,
    /// Activation on each vCPU (0: none).
    current: Vec<u32>,
    /// Per vCPU: its last activation, if it ended by `sa_yield` (no record names it; the next
    /// NEWPROC on that vCPU does, in its `arg`).
    yielded: Vec<u32>,
    /// Producer index of each vCPU's queue; the VMM's copy is the authoritative one.
    heads: Vec<u32>,
    /// Consumer index of the stack pool; the VMM's copy is the authoritative one.
    stack_cons: u32,
    pending: VecDeque<Event>,
    /// Since when a pending event has found no room in a queue (a guest that does not keep up
    /// with its upcalls, or does not consume them at all).
    stalled_since: Option<std::time::Instant>,
    /// Pool stacks of activations canceled before they ran: reused before the pool.
    spare_stacks: Vec<u64>,
    /// Where each BLOCKED record went: (blocked activation, vCPU queue, activation running
    /// there), so its UNBLOCKED can follow it into the same queue.
    blocked_records: Vec<(u32, u32, u32)>,
    /// Per vCPU: the consumer index its queue has kept, with records behind it, and since when
    /// (`untaken_for`).
    untaken_since: Vec<Option<(u32, Instant)>>,
}

/// One guest's activation state.
#[derive(Debug)]
pub struct Activations {
    state: Mutex<State>,
    /// Whether this guest may use activations at all (`--no-activations` says no).
    allowed: bool,
}

impl Activations {
    pub fn new(nr_vcpus: u32, allowed: bool) -> Activations {
        Activations {
            state: Mutex::new(State {
                entry: None,
                enabled: false,
                next_seq: 1,
                // Boot activations are 1..=nr_vcpus (see bootinfo).
                next_activation: nr_vcpus + 1,
                current: (1..=nr_vcpus).collect(),
                yielded: vec![0; nr_vcpus as usize],
                heads: vec![0; nr_vcpus as usize],
                stack_cons: 0,
                pending: VecDeque::new(),
                stalled_since: None,
                spare_stacks: Vec::new(),
                blocked_records: Vec::new(),
                untaken_since: vec![None; nr_vcpus as usize],
            }),
            allowed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn allowed(&self) -> bool {
        self.allowed
    }

    pub fn enabled(&self) -> bool {
        self.lock().enabled
    }

    pub fn current(&self, vcpu: u32) -> u32 {
        self.lock().current[vcpu as usize]
    }

    pub fn register(&self, entry: u64) {
        self.lock().entry = Some(entry);
    }

    /// `sa_enable`: needs a registered entry.
    pub fn enable(&self) -> Result<(), &'static str> {
        let mut state = self.lock();
        if !self.allowed {
            return Err("activations are disabled (--no-activations)");
        }
        if state.entry.is_none() {
            return Err("sa_enable before sa_register");
        }
        state.enabled = true;
        Ok(())
    }

    /// The vCPU lost its activation (preempted or yielded); records it in the shared area and
    /// takes back what its queue still holds.
    pub fn end_activation(&self, area: SharedArea<'_>, vcpu: u32, why: VcpuRunState) {
        let mut state = self.lock();
        state.current[vcpu as usize] = 0;
        area.set_run_state(vcpu, why, 0);
        take_back(&mut state, area, vcpu);
    }

    /// The activation on `vcpu` gave its processor back (`sa_yield`): it ends, and the next
    /// NEWPROC on this vCPU names it (the guest's only word that it is over).
    pub fn yield_activation(&self, area: SharedArea<'_>, vcpu: u32) {
        let activation = self.current(vcpu);
        self.end_activation(area, vcpu, VcpuRunState::Stopped);
        self.lock().yielded[vcpu as usize] = activation;
    }

    /// Cancel the activation `start` just started on `vcpu`, which lost its processor before it
    /// ran one instruction: no PREEMPTED record (there is no context), its NEWPROC is dropped
    /// with the other unconsumed records taken back, its stack is kept for the next one.
    pub fn cancel_activation(&self, area: SharedArea<'_>, vcpu: u32, start: NewActivation) {
        self.end_activation(area, vcpu, VcpuRunState::Stopped);
        let mut state = self.lock();
        state.spare_stacks.push(start.stack_top);
        // Its NEWPROC was dropped: the next one on this vCPU names the yielded activation.
        if start.previous_yielded != 0 {
            state.yielded[vcpu as usize] = start.previous_yielded;
        }
    }

    /// Write `event` into the queue of running vCPU `target` (the caller then raises the
    /// upcall interrupt there), or keep it pending when `target` is `None`.
    pub fn post(
        &self,
        area: SharedArea<'_>,
        event: Event,
        target: Option<u32>,
    ) -> Result<Option<u32>, QueueError> {
        let mut state = self.lock();
        state.pending.push_back(event);
        let written = match target {
            Some(target) => drain_into(&mut state, area, target)?,
            None => 0,
        };
        if state.pending.len() > MAX_PENDING {
            return Err(QueueError::Full);
        }
        Ok(if written > 0 { target } else { None })
    }

    /// Write the pending events into the queue of `target`, which is about to run or runs;
    /// returns how many went out (the caller raises the upcall interrupt if any did). What does
    /// not fit stays pending.
    pub fn flush_pending(&self, area: SharedArea<'_>, target: u32) -> Result<usize, QueueError> {
        let mut state = self.lock();
        drain_into(&mut state, area, target)
    }

    /// Whether `vcpu`'s queue has held records the guest has not taken, its consumer index
    /// unmoved, for `bound` or more since this was first seen or last answered `true` (the
    /// upcall watchdog, `Guest::watch_upcall_queues`, asks this of running vCPUs).
    pub fn untaken_for(&self, area: SharedArea<'_>, vcpu: u32, bound: Duration) -> bool {
        let mut state = self.lock();
        let Some(&head) = state.heads.get(vcpu as usize) else {
            return false;
        };
        let tail = area.queue_tail(vcpu).unwrap_or(head);
        let now = Instant::now();
        let seen = &mut state.untaken_since[vcpu as usize];
        match seen {
            _ if head == tail => *seen = None,
            Some((at, since)) if *at == tail => {
                if now.saturating_duration_since(*since) >= bound {
                    *since = now;
                    return true;
                }
            }
            _ => *seen = Some((tail, now)),
        }
        false
    }

    /// How long the guest's queues have had no room for a pending event (`None`: they had).
    pub fn stalled_for(&self) -> Option<std::time::Duration> {
        self.lock().stalled_since.map(|since| since.elapsed())
    }

    /// Start a new activation on `vcpu`: take a stack from the guest's pool, write NEWPROC and
    /// every pending event into the vCPU's own queue.
    pub fn start_activation(
        &self,
        area: SharedArea<'_>,
        vcpu: u32,
    ) -> Result<NewActivation, StartError> {
        let mut state = self.lock();
        let entry = state.entry.ok_or_else(|| {
            StartError::Fatal("a new activation is due but no upcall entry is registered".into())
        })?;
        let stack_top = pop_stack(&mut state, area)?;
        let activation = state.next_activation;
        state.next_activation = state.next_activation.wrapping_add(1).max(1);
        state.current[vcpu as usize] = activation;
        area.set_run_state(vcpu, VcpuRunState::Running, activation);
        let previous_yielded = std::mem::take(&mut state.yielded[vcpu as usize]);
        let newproc = Event::new(
            UpcallKind::NewProc,
            activation,
            vcpu,
            previous_yielded as u64,
        );
        write_record(&mut state, area, vcpu, newproc).map_err(|e| {
            StartError::Fatal(match e {
                QueueError::Full => format!(
                    "no room for the NEWPROC record in vCPU {vcpu}'s queue: the guest does not \
                     consume its upcalls, or corrupted its queue indices"
                ),
                QueueError::Memory(e) => format!("cannot write the NEWPROC record: {e}"),
            })
        })?;
        while let Some(event) = state.pending.pop_front() {
            if write_record(&mut state, area, vcpu, event.clone()).is_err() {
                state.pending.push_front(event);
                break;
            }
        }
        // Everything went out: the queues have room again (a stall clock left running here
        // stopped a guest a second later for events it had long taken).
        if state.pending.is_empty() {
            state.stalled_since = None;
        }
        Ok(NewActivation {
            entry,
            stack_top,
            activation,
            previous_yielded,
        })
    }

    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// What a stalled guest's upcall machinery looks like (diagnostics for its fault report):
    /// per vCPU its activation and queue occupancy, then the stack pool.
    pub fn describe(&self, area: SharedArea<'_>) -> String {
        let state = self.lock();
        let mut out = String::new();
        for (vcpu, (&activation, &head)) in state.current.iter().zip(&state.heads).enumerate() {
            let tail = area.queue_tail_or_max(vcpu as u32);
            out += &format!(
                "vCPU {vcpu}: activation {activation}, {} records queued; ",
                head.wrapping_sub(tail)
            );
        }
        let prod = area.stack_prod().unwrap_or(u32::MAX);
        out += &format!(
            "stack pool: {} stacks ready, {} kept from canceled activations; {} events pending",
            prod.wrapping_sub(state.stack_cons),
            state.spare_stacks.len(),
            state.pending.len()
        );
        out
    }

    /// The vCPU whose queue got the BLOCKED record of `activation`, if that vCPU still runs
    /// the activation that queue belongs to: the UNBLOCKED goes there too, behind it (a
    /// vCPU's queue is consumed in order). Forgets the record either way.
    pub fn blocked_record_queue(&self, activation: u32) -> Option<u32> {
        let mut state = self.lock();
        let at = state
            .blocked_records
            .iter()
            .position(|&(blocked, _, _)| blocked == activation)?;
        let (_, vcpu, there) = state.blocked_records.swap_remove(at);
        (state.current[vcpu as usize] == there).then_some(vcpu)
    }
}

/// An upcall kind as traces name it.
pub fn upcall_name(kind: UpcallKind) -> &'static str {
    match kind {
        UpcallKind::NewProc => "upcall NEWPROC",
        UpcallKind::Preempted => "upcall PREEMPTED",
        UpcallKind::Blocked => "upcall BLOCKED",
        UpcallKind::Unblocked => "upcall UNBLOCKED",
        UpcallKind::Signal => "upcall SIGNAL",
        UpcallKind::User => "upcall USER",
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use protocol::shared::{vcpu_area_offset, SharedHeader, VcpuArea};

    use super::*;
    use crate::memory::{GuestRam, Plan, StackSlots};

    const MEM: u64 = 16 << 20;
    const IMAGE: u64 = protocol::arch::current::IMAGE_BASE;

    #[test]
    fn a_stall_ends_when_a_new_activation_takes_the_pending_events() {
        let stacks = StackSlots::new(4096, Some(4), MEM).unwrap();
        let plan = Plan::new(1, MEM, IMAGE..IMAGE + 0x1_0000, IMAGE, 16, IMAGE, stacks).unwrap();
        let ram = GuestRam::new(MEM).unwrap();
        let area = SharedArea::new(&ram, &plan);
        let base = plan.shared_area.start;
        // The guest's stack pool: two stacks.
        for slot in 0..2u64 {
            let at = base + offset_of!(SharedHeader, stacks) as u64 + 8 * slot;
            ram.write_u64(at, IMAGE + 0x1000 * (slot + 1)).unwrap();
        }
        ram.write_u32(base + offset_of!(SharedHeader, stack_prod) as u64, 2)
            .unwrap();
        let acts = Activations::new(1, true);
        acts.register(IMAGE);
        acts.enable().unwrap();
        acts.start_activation(area, 0).unwrap();
        // The guest takes nothing: the queue fills, the next event waits, the clock runs.
        for _ in 0..UPCALL_QUEUE_CAPACITY {
            let _ = acts.post(area, Event::new(UpcallKind::Signal, 1, 0, 0), Some(0));
        }
        assert_eq!(acts.pending(), 1);
        assert!(acts.stalled_for().is_some());
        // It takes every record; the activation ends and a new one takes the pending event.
        let head = ram
            .read_bytes(
                base + (vcpu_area_offset(0) + offset_of!(VcpuArea, queue_head)) as u64,
                4,
            )
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .unwrap();
        ram.write_u32(
            base + (vcpu_area_offset(0) + offset_of!(VcpuArea, queue_tail)) as u64,
            head,
        )
        .unwrap();
        acts.end_activation(area, 0, VcpuRunState::Preempted);
        acts.start_activation(area, 0).unwrap();
        assert_eq!(acts.pending(), 0);
        assert_eq!(
            acts.stalled_for(),
            None,
            "the stall clock outlived the stall"
        );
    }
}
