//! Writing upcall records into a vCPU's queue, taking unconsumed ones back, and taking stacks
//! from the guest's pool: the layout work under the [`Activations`](super::Activations) lock.

use protocol::shared::{
    UpcallKind, UpcallRecord, RECORD_HAS_CONTEXT, STACK_POOL_CAPACITY, UPCALL_QUEUE_CAPACITY,
};

use super::{Event, QueueError, SharedArea, StartError, State};
use crate::arch::current::abi::UserContext;

/// Move pending events, oldest first, into `target`'s queue until it is full; records whether
/// the queues are stalled. Returns how many were written.
pub(super) fn drain_into(
    state: &mut State,
    area: SharedArea<'_>,
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
        match write_record(state, area, target, event.clone()) {
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
/// Write `event` into `vcpu`'s queue, giving it a sequence number if it has none.
pub(super) fn write_record(
    state: &mut State,
    area: SharedArea<'_>,
    vcpu: u32,
    mut event: Event,
) -> Result<(), QueueError> {
    let head = state.heads[vcpu as usize];
    let tail = area
        .queue_tail(vcpu)
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
    area.write_record(vcpu, slot, &record)
        .map_err(|e| QueueError::Memory(e.to_string()))?;
    // Release: the record is complete before the new head is visible (x86 stores are ordered;
    // the fence keeps the compiler from reordering them).
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    state.heads[vcpu as usize] = head.wrapping_add(1);
    area.set_queue_head(vcpu, head.wrapping_add(1))
        .map_err(|e| QueueError::Memory(e.to_string()))
}

/// Take back the records `vcpu`'s queue still holds unconsumed ([tail, head)), NEWPROCs
/// dropped, and put them at the front of the pending events in their order. The vCPU is
/// stopped, so nobody reads them now.
pub(super) fn take_back(state: &mut State, area: SharedArea<'_>, vcpu: u32) {
    let head = state.heads[vcpu as usize];
    let tail = area.queue_tail(vcpu).unwrap_or(head);
    let unconsumed = head.wrapping_sub(tail);
    if unconsumed == 0 || unconsumed as usize > UPCALL_QUEUE_CAPACITY {
        return;
    }
    let mut taken = Vec::new();
    for i in 0..unconsumed {
        let slot = (tail.wrapping_add(i) as usize) % UPCALL_QUEUE_CAPACITY;
        if let Ok(record) = area.read_record::<RecordRaw>(vcpu, slot) {
            // A NEWPROC belongs to the activation that started here and to no other vCPU.
            let event = record.into_event();
            if event.kind != UpcallKind::NewProc {
                taken.push(event);
            }
        }
    }
    state.heads[vcpu as usize] = tail;
    let _ = area.set_queue_head(vcpu, tail);
    for event in taken.into_iter().rev() {
        state.pending.push_front(event);
    }
}

/// Take a stack for a new activation: one kept from a canceled activation, else the next of
/// the guest's pool.
pub(super) fn pop_stack(state: &mut State, area: SharedArea<'_>) -> Result<u64, StartError> {
    if let Some(top) = state.spare_stacks.pop() {
        return Ok(top);
    }
    let fatal = |e: crate::error::Error| StartError::Fatal(e.to_string());
    let prod = area.stack_prod().map_err(fatal)?;
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
    let top = area.stack(slot).map_err(fatal)?;
    let plan = area.plan();
    if top % 16 != 0 || top < plan.image.start + 64 || top > plan.mem_size {
        return Err(StartError::Fatal(format!(
            "upcall stack pool entry {slot} holds a bad stack top {top:#x}"
        )));
    }
    state.stack_cons = state.stack_cons.wrapping_add(1);
    area.set_stack_cons(state.stack_cons).map_err(fatal)?;
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
