//! The VMM side of scheduler activations: upcall records, their delivery, new activations.
//!
//! Every event that changes a guest's processors becomes an [`Event`]. It is written as a
//! record into the upcall queue of a vCPU that is running (other than the one the event is
//! about) and that vCPU gets the upcall interrupt; when none is running the event waits in
//! `pending` and goes out with the next new activation, ahead of nothing but its NEWPROC record
//! (seed 000, section 4.1). Sequence numbers are given when a record is written, under the one
//! lock that serialises all writers of the guest's queues, so they are gap-free and ordered.
//!
//! Records left unconsumed in the queue of a vCPU that loses its processor are taken back
//! (that vCPU cannot run its handler) and delivered elsewhere with their sequence numbers, so
//! no event waits on a vCPU that may never run again.

use std::collections::VecDeque;
use std::mem::offset_of;
use std::sync::{Mutex, MutexGuard};

use protocol::shared::{
    SharedHeader, UpcallKind, UpcallRecord, VcpuArea, VcpuRunState, RECORD_HAS_CONTEXT,
    STACK_POOL_CAPACITY, UPCALL_QUEUE_CAPACITY,
};

use crate::arch::current::abi::UserContext;
use crate::memory::{GuestRam, Plan};

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
            tsc: crate::rdtsc(),
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
struct State {
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
}

/// One guest's activation state.
#[derive(Debug)]
pub struct Activations {
    state: Mutex<State>,
    /// Whether this guest may use activations at all (`--no-activations` says no).
    allowed: bool,
}

/// The counters `--stats` prints.
#[derive(Debug, Default, Clone)]
pub struct UpcallCounts {
    pub by_kind: [u64; 7],
}

fn area_field(plan: &Plan, vcpu: u32, offset: usize) -> u64 {
    plan.vcpu_area(vcpu) + offset as u64
}

fn header_field(plan: &Plan, offset: usize) -> u64 {
    plan.shared_area.start + offset as u64
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

    /// Whether the guest asks to defer a preemption of `vcpu` (`VcpuArea::defer_preemption`).
    pub fn defer_requested(&self, ram: &GuestRam, plan: &Plan, vcpu: u32) -> bool {
        ram.read_bytes(
            area_field(plan, vcpu, offset_of!(VcpuArea, defer_preemption)),
            4,
        )
        .map(|b| b != [0, 0, 0, 0])
        .unwrap_or(false)
    }

    /// Tell the guest the VMM wants `vcpu`'s processor back (`VcpuArea::preempt_pending`).
    pub fn set_preempt_pending(&self, ram: &GuestRam, plan: &Plan, vcpu: u32, pending: bool) {
        let _ = ram.write_u32(
            area_field(plan, vcpu, offset_of!(VcpuArea, preempt_pending)),
            pending as u32,
        );
    }

    /// The vCPU lost its activation (preempted or yielded); records it in the shared area and
    /// takes back what its queue still holds.
    pub fn end_activation(&self, ram: &GuestRam, plan: &Plan, vcpu: u32, why: VcpuRunState) {
        let mut state = self.lock();
        state.current[vcpu as usize] = 0;
        let _ = ram.write_u32(
            area_field(plan, vcpu, offset_of!(VcpuArea, state)),
            why as u32,
        );
        let _ = ram.write_u32(area_field(plan, vcpu, offset_of!(VcpuArea, activation)), 0);
        // Unconsumed records: [tail, head). The vCPU is stopped, so nobody reads them now.
        let head = state.heads[vcpu as usize];
        let tail = ram
            .read_bytes(area_field(plan, vcpu, offset_of!(VcpuArea, queue_tail)), 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .unwrap_or(head);
        let unconsumed = head.wrapping_sub(tail);
        if unconsumed == 0 || unconsumed as usize > UPCALL_QUEUE_CAPACITY {
            return;
        }
        let mut taken = Vec::new();
        for i in 0..unconsumed {
            let slot = (tail.wrapping_add(i) as usize) % UPCALL_QUEUE_CAPACITY;
            if let Ok(record) = ram.read_struct::<RecordRaw>(record_addr(plan, vcpu, slot)) {
                // A NEWPROC belongs to the activation that started here and to no other vCPU.
                let event = record.into_event();
                if event.kind != UpcallKind::NewProc {
                    taken.push(event);
                }
            }
        }
        state.heads[vcpu as usize] = tail;
        let _ = ram.write_u32(
            area_field(plan, vcpu, offset_of!(VcpuArea, queue_head)),
            tail,
        );
        // Back to the front, in their order.
        for event in taken.into_iter().rev() {
            state.pending.push_front(event);
        }
    }

    /// The activation on `vcpu` gave its processor back (`sa_yield`): it ends, and the next
    /// NEWPROC on this vCPU names it (the guest's only word that it is over).
    pub fn yield_activation(&self, ram: &GuestRam, plan: &Plan, vcpu: u32) {
        let activation = self.current(vcpu);
        self.end_activation(ram, plan, vcpu, VcpuRunState::Stopped);
        self.lock().yielded[vcpu as usize] = activation;
    }

    /// Cancel the activation `start` just started on `vcpu`, which lost its processor before it
    /// ran one instruction: no PREEMPTED record (there is no context), its NEWPROC is dropped
    /// with the other unconsumed records taken back, its stack is kept for the next one.
    pub fn cancel_activation(&self, ram: &GuestRam, plan: &Plan, vcpu: u32, start: NewActivation) {
        self.end_activation(ram, plan, vcpu, VcpuRunState::Stopped);
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
        ram: &GuestRam,
        plan: &Plan,
        event: Event,
        target: Option<u32>,
    ) -> Result<Option<u32>, QueueError> {
        let mut state = self.lock();
        state.pending.push_back(event);
        let written = match target {
            Some(target) => drain_into(&mut state, ram, plan, target)?,
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
    pub fn flush_pending(
        &self,
        ram: &GuestRam,
        plan: &Plan,
        target: u32,
    ) -> Result<usize, QueueError> {
        let mut state = self.lock();
        drain_into(&mut state, ram, plan, target)
    }

    /// How long the guest's queues have had no room for a pending event (`None`: they had).
    pub fn stalled_for(&self) -> Option<std::time::Duration> {
        self.lock().stalled_since.map(|since| since.elapsed())
    }

    /// Start a new activation on `vcpu`: take a stack from the guest's pool, write NEWPROC and
    /// every pending event into the vCPU's own queue.
    pub fn start_activation(
        &self,
        ram: &GuestRam,
        plan: &Plan,
        vcpu: u32,
    ) -> Result<NewActivation, StartError> {
        let mut state = self.lock();
        let entry = state.entry.ok_or_else(|| {
            StartError::Fatal("a new activation is due but no upcall entry is registered".into())
        })?;
        let stack_top = pop_stack(&mut state, ram, plan)?;
        let activation = state.next_activation;
        state.next_activation = state.next_activation.wrapping_add(1).max(1);
        state.current[vcpu as usize] = activation;
        let _ = ram.write_u32(
            area_field(plan, vcpu, offset_of!(VcpuArea, activation)),
            activation,
        );
        let _ = ram.write_u32(
            area_field(plan, vcpu, offset_of!(VcpuArea, state)),
            VcpuRunState::Running as u32,
        );
        let previous_yielded = std::mem::take(&mut state.yielded[vcpu as usize]);
        let newproc = Event::new(
            UpcallKind::NewProc,
            activation,
            vcpu,
            previous_yielded as u64,
        );
        write_record(&mut state, ram, plan, vcpu, newproc)
            .map_err(|e| StartError::Fatal(format!("cannot write the NEWPROC record: {e:?}")))?;
        while let Some(event) = state.pending.pop_front() {
            if write_record(&mut state, ram, plan, vcpu, event.clone()).is_err() {
                state.pending.push_front(event);
                break;
            }
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
    pub fn describe(&self, ram: &GuestRam, plan: &Plan) -> String {
        let state = self.lock();
        let read_u32 = |at: u64| {
            ram.read_bytes(at, 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .unwrap_or(u32::MAX)
        };
        let mut out = String::new();
        for (vcpu, (&activation, &head)) in state.current.iter().zip(&state.heads).enumerate() {
            let tail = read_u32(area_field(
                plan,
                vcpu as u32,
                offset_of!(VcpuArea, queue_tail),
            ));
            out += &format!(
                "vCPU {vcpu}: activation {activation}, {} records queued; ",
                head.wrapping_sub(tail)
            );
        }
        let prod = read_u32(header_field(plan, offset_of!(SharedHeader, stack_prod)));
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

/// Where BLOCKED records went, at most: a vCPU blocks one activation at a time, so more
/// entries than vCPUs are records whose UNBLOCKED never came (a guest's doing); the oldest go.
const MAX_BLOCKED_RECORDS: usize = 2 * protocol::MAX_VCPUS;

/// Note where activation `entry.0`'s BLOCKED record went, keeping the list bounded.
fn remember_blocked(records: &mut Vec<(u32, u32, u32)>, entry: (u32, u32, u32)) {
    records.retain(|&(a, _, _)| a != entry.0);
    if records.len() >= MAX_BLOCKED_RECORDS {
        records.remove(0);
    }
    records.push(entry);
}

/// Move pending events, oldest first, into `target`'s queue until it is full; records whether
/// the queues are stalled. Returns how many were written.
fn drain_into(
    state: &mut State,
    ram: &GuestRam,
    plan: &Plan,
    target: u32,
) -> Result<usize, QueueError> {
    // The target was chosen as running, but its activation may have ended since (it yielded,
    // was preempted or blocked, and its queue was emptied under this lock): a record written
    // now would wait there unread. Keep everything pending; the vCPU that ended it flushes.
    if state.current[target as usize] == 0 {
        return Ok(0);
    }
    let mut written = 0;
    while let Some(event) = state.pending.pop_front() {
        match write_record(state, ram, plan, target, event.clone()) {
            Ok(()) => written += 1,
            Err(QueueError::Full) => {
                state.pending.push_front(event);
                state
                    .stalled_since
                    .get_or_insert_with(std::time::Instant::now);
                return Ok(written);
            }
            Err(e) => {
                state.pending.push_front(event);
                return Err(e);
            }
        }
    }
    state.stalled_since = None;
    Ok(written)
}

/// Guest-physical address of record slot `slot` of vCPU `vcpu`'s queue.
fn record_addr(plan: &Plan, vcpu: u32, slot: usize) -> u64 {
    area_field(plan, vcpu, offset_of!(VcpuArea, records))
        + (slot * std::mem::size_of::<UpcallRecord>()) as u64
}

fn write_record(
    state: &mut State,
    ram: &GuestRam,
    plan: &Plan,
    vcpu: u32,
    mut event: Event,
) -> Result<(), QueueError> {
    let head = state.heads[vcpu as usize];
    let tail = ram
        .read_bytes(area_field(plan, vcpu, offset_of!(VcpuArea, queue_tail)), 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .map_err(|e| QueueError::Memory(e.to_string()))?;
    // The guest's tail may be anything: only `head - tail` in 0..CAP means room.
    if head.wrapping_sub(tail) as usize >= UPCALL_QUEUE_CAPACITY {
        return Err(QueueError::Full);
    }
    if event.seq == 0 {
        event.seq = state.next_seq;
        state.next_seq += 1;
    }
    let record = UpcallRecord {
        seq: event.seq,
        kind: event.kind as u32,
        flags: if event.context.is_some() {
            RECORD_HAS_CONTEXT
        } else {
            0
        },
        activation: event.activation,
        vcpu: event.vcpu,
        delivered_to: state.current[vcpu as usize],
        _pad: 0,
        arg: event.arg,
        tsc: event.tsc,
        _reserved: [0; 2],
        context: event.context.map(|c| *c).unwrap_or_default(),
    };
    if event.kind == UpcallKind::Blocked {
        let there = state.current[vcpu as usize];
        remember_blocked(&mut state.blocked_records, (event.activation, vcpu, there));
    }
    let slot = head as usize % UPCALL_QUEUE_CAPACITY;
    ram.write_struct(record_addr(plan, vcpu, slot), &record)
        .map_err(|e| QueueError::Memory(e.to_string()))?;
    // Release: the record is complete before the new head is visible (x86 stores are ordered;
    // the fence keeps the compiler from reordering them).
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    state.heads[vcpu as usize] = head.wrapping_add(1);
    ram.write_u32(
        area_field(plan, vcpu, offset_of!(VcpuArea, queue_head)),
        head.wrapping_add(1),
    )
    .map_err(|e| QueueError::Memory(e.to_string()))
}

fn pop_stack(state: &mut State, ram: &GuestRam, plan: &Plan) -> Result<u64, StartError> {
    if let Some(top) = state.spare_stacks.pop() {
        return Ok(top);
    }
    let fatal = |e: crate::Error| StartError::Fatal(e.to_string());
    let prod = ram
        .read_bytes(header_field(plan, offset_of!(SharedHeader, stack_prod)), 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .map_err(fatal)?;
    let available = prod.wrapping_sub(state.stack_cons);
    if available == 0 {
        return Err(StartError::NoStack);
    }
    if available as usize > STACK_POOL_CAPACITY {
        return Err(StartError::Fatal(format!(
            "the upcall stack pool's indices are corrupt (stack_prod {prod}, stack_cons {})",
            state.stack_cons
        )));
    }
    let slot = state.stack_cons as usize % STACK_POOL_CAPACITY;
    let top = ram
        .read_u64(header_field(plan, offset_of!(SharedHeader, stacks)) + 8 * slot as u64)
        .map_err(fatal)?;
    if top % 16 != 0 || top < plan.image.start + 64 || top > plan.mem_size {
        return Err(StartError::Fatal(format!(
            "upcall stack pool entry {slot} holds a bad stack top {top:#x}"
        )));
    }
    state.stack_cons = state.stack_cons.wrapping_add(1);
    ram.write_u32(
        header_field(plan, offset_of!(SharedHeader, stack_cons)),
        state.stack_cons,
    )
    .map_err(fatal)?;
    Ok(top)
}

/// A record as read back from guest memory (integers only, so any bytes are valid).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct RecordRaw {
    seq: u64,
    kind: u32,
    flags: u32,
    activation: u32,
    vcpu: u32,
    delivered_to: u32,
    _pad: u32,
    arg: u64,
    tsc: u64,
    _reserved: [u64; 2],
    context: UserContext,
}

const _: () = assert!(std::mem::size_of::<RecordRaw>() == std::mem::size_of::<UpcallRecord>());

impl RecordRaw {
    /// Only records the VMM wrote are read back, so the kind is valid; a record the guest
    /// scribbled over becomes a SIGNAL 0 the guest ignores.
    fn into_event(self) -> Event {
        Event {
            kind: UpcallKind::from_raw(self.kind).unwrap_or(UpcallKind::Signal),
            activation: self.activation,
            vcpu: self.vcpu,
            arg: self.arg,
            context: (self.flags & RECORD_HAS_CONTEXT != 0).then(|| Box::new(self.context)),
            seq: self.seq,
            tsc: self.tsc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_records_are_bounded() {
        let mut records = Vec::new();
        for activation in 0..10_000 {
            remember_blocked(&mut records, (activation, activation % 4, 7));
        }
        assert_eq!(records.len(), MAX_BLOCKED_RECORDS);
        assert_eq!(records.last(), Some(&(9_999, 3, 7)));
        remember_blocked(&mut records, (9_999, 0, 8));
        assert_eq!(records.len(), MAX_BLOCKED_RECORDS);
        assert_eq!(records.iter().filter(|r| r.0 == 9_999).count(), 1);
    }
}
