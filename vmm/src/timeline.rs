//! The guest runtime's timeline in `--trace` (`protocol::timeline`): the VMM drains the
//! runtime's per-vCPU rings and turns their events into trace events on one extra track per
//! vCPU ("vCPU N: threads", beside the VMM's "vCPU N" track): a slice per stretch a thread ran
//! there, an instant per upcall record the runtime handled there, and a flow arrow from the
//! slice whose context the VMM handed over (PREEMPTED, or BLOCKED in the VMM) to the slice
//! where that thread ran again.
//!
//! Memory stays bounded: events go to the trace file as they are merged; what is kept is one
//! open slice per vCPU, and per live thread its name and whether its context was handed over.

use std::collections::HashMap;
use std::mem::offset_of;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Mutex, MutexGuard};

use protocol::shared::UpcallKind;
use protocol::timeline::{
    split_record_arg, RecordAction, SwitchReason, TimelineEvent, TimelineKind, TimelineRing,
    TIMELINE_RING_CAPACITY,
};

use crate::memory::GuestRam;
use crate::trace::Trace;

/// The guest-thread track of vCPU `v` is trace thread `THREAD_TRACKS + v`.
pub const THREAD_TRACKS: u32 = 1000;
/// Threads whose handed-over context is remembered at most (a guest that never resumes them).
const MAX_HANDED: usize = 1 << 16;
/// Longest thread name kept.
const MAX_NAME: usize = 32;

/// A guest's timeline: its rings (once registered) and the merge state.
#[derive(Debug)]
pub struct Timeline {
    nr_vcpus: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Guest-physical address of the first ring (after `timeline_setup`).
    rings: Option<u64>,
    /// Per vCPU: the thread running there in the guest's view.
    running: Vec<Option<Slice>>,
    /// Threads whose context the VMM handed over, until they run again.
    handed: HashMap<u64, Handed>,
    names: HashMap<u64, [u8; MAX_NAME]>,
    next_flow: u64,
    /// Per ring: the guest's drop counter, last seen.
    dropped: Vec<u64>,
    /// Events skipped: unknown kinds, timestamps outside the run.
    skipped: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slice {
    thread: u64,
    start: u64,
    /// Where its context came from, for the flow arrow.
    from: Option<Handed>,
}

#[derive(Clone, Copy, Debug)]
struct Handed {
    vcpu: u32,
    /// A time inside the slice that ended with the hand-over (us).
    at: f64,
    kind: UpcallKind,
}

impl Timeline {
    pub fn new(nr_vcpus: u32) -> Timeline {
        Timeline {
            nr_vcpus,
            state: Mutex::new(State {
                running: vec![None; nr_vcpus as usize],
                dropped: vec![0; nr_vcpus as usize],
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `timeline_setup(gpa, nr_rings)` from guest `guest`, whose image starts at
    /// `image_start`: `Err` is a protocol violation.
    pub fn setup(
        &self,
        ram: &GuestRam,
        image_start: u64,
        trace: &Trace,
        guest: usize,
        gpa: u64,
        nr_rings: u64,
    ) -> Result<u64, String> {
        let size = std::mem::size_of::<TimelineRing>() as u64 * u64::from(self.nr_vcpus);
        if nr_rings != u64::from(self.nr_vcpus) {
            return Err(format!(
                "{nr_rings} timeline rings for {} vCPUs",
                self.nr_vcpus
            ));
        }
        let inside =
            gpa >= image_start && gpa.checked_add(size).is_some_and(|end| end <= ram.size());
        if !inside || !gpa.is_multiple_of(64) {
            return Err(format!(
                "timeline rings {gpa:#x}+{size} are not 64-byte aligned in guest RAM at or above {image_start:#x}"
            ));
        }
        let mut state = self.lock();
        if state.rings.is_some() {
            return Err("the timeline rings are set up already".into());
        }
        for v in 0..self.nr_vcpus {
            let ring = ring_addr(gpa, v);
            for field in [
                offset_of!(TimelineRing, head),
                offset_of!(TimelineRing, tail),
            ] {
                ram.write_u32(ring + field as u64, 0)
                    .map_err(|e| e.to_string())?;
            }
            ram.write_u64(ring + offset_of!(TimelineRing, dropped) as u64, 0)
                .map_err(|e| e.to_string())?;
        }
        state.rings = Some(gpa);
        self.name_tracks(trace, guest);
        Ok(0)
    }

    /// Name the tracks of guest `guest` (its vCPUs' and their threads').
    fn name_tracks(&self, trace: &Trace, guest: usize) {
        for v in 0..self.nr_vcpus {
            trace.name_track(guest, v, &format!("vCPU {v}"), 2 * v);
            trace.name_track(
                guest,
                THREAD_TRACKS + v,
                &format!("vCPU {v}: threads"),
                2 * v + 1,
            );
        }
    }

    /// Merge what the rings hold into the trace.
    pub fn drain(&self, ram: &GuestRam, trace: &Trace, guest: usize) {
        let mut state = self.lock();
        state.drain(ram, trace, guest, self.nr_vcpus);
    }

    /// The VMM took the context of vCPU `vcpu` at `tsc` (a PREEMPTED or BLOCKED hand-over):
    /// the thread the guest ran there stops there; the next slice of it gets an arrow from
    /// this one.
    pub fn handed_over(
        &self,
        ram: &GuestRam,
        trace: &Trace,
        guest: usize,
        vcpu: u32,
        kind: UpcallKind,
        tsc: u64,
    ) {
        let mut state = self.lock();
        state.drain(ram, trace, guest, self.nr_vcpus);
        state.hand_over(trace, guest, vcpu, kind, tsc);
    }

    /// The guest ended: merge the rest, close open slices now, and note dropped events.
    pub fn finish(&self, ram: &GuestRam, trace: &Trace, guest: usize) {
        let mut state = self.lock();
        state.drain(ram, trace, guest, self.nr_vcpus);
        let now = crate::rdtsc();
        for v in 0..self.nr_vcpus {
            if let Some(slice) = state.running[v as usize].take() {
                state.emit_slice(trace, guest, v, slice, now, "guest end");
            }
        }
        let dropped: u64 = state.dropped.iter().sum();
        if state.rings.is_none() {
            return;
        }
        if let Some(ts) = trace.micros(now) {
            trace.raw(format_args!(
                "{{\"name\":\"timeline\",\"ph\":\"i\",\"s\":\"p\",\"ts\":{ts:.3},\"pid\":{guest},\"tid\":{THREAD_TRACKS},\"args\":{{\"dropped\":{dropped},\"skipped\":{}}}}}",
                state.skipped
            ));
        }
    }

    /// Once the rings are registered: events the guest dropped because a ring was full (as
    /// last seen), and events the VMM skipped as malformed.
    pub fn losses(&self) -> Option<(u64, u64)> {
        let state = self.lock();
        state.rings?;
        Some((state.dropped.iter().sum(), state.skipped))
    }
}

fn ring_addr(rings: u64, vcpu: u32) -> u64 {
    rings + u64::from(vcpu) * std::mem::size_of::<TimelineRing>() as u64
}

fn read_u32(ram: &GuestRam, gpa: u64) -> Option<u32> {
    let bytes = ram.read_bytes(gpa, 4).ok()?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

impl State {
    fn hand_over(&mut self, trace: &Trace, guest: usize, vcpu: u32, kind: UpcallKind, tsc: u64) {
        let Some(slice) = self.running.get_mut(vcpu as usize).and_then(Option::take) else {
            return;
        };
        let reason = if kind == UpcallKind::Blocked {
            "blocked in the VMM"
        } else {
            "preempted by the VMM"
        };
        // A thread switched in after the kick (the VMM let the vCPU run on: a deferral, a run
        // forward) ran until now.
        let end = if slice.start > tsc {
            crate::rdtsc()
        } else {
            tsc
        };
        let Some((start, end)) = self.emit_slice(trace, guest, vcpu, slice, end, reason) else {
            return;
        };
        if self.handed.len() >= MAX_HANDED {
            self.handed.clear();
        }
        let at = end - ((end - start) / 2.0).min(0.001);
        self.handed.insert(slice.thread, Handed { vcpu, at, kind });
    }

    fn drain(&mut self, ram: &GuestRam, trace: &Trace, guest: usize, nr_vcpus: u32) {
        let Some(rings) = self.rings else {
            return;
        };
        for v in 0..nr_vcpus {
            let ring = ring_addr(rings, v);
            if let Ok(dropped) = ram.read_u64(ring + offset_of!(TimelineRing, dropped) as u64) {
                self.dropped[v as usize] = dropped;
            }
            let tail_at = ring + offset_of!(TimelineRing, tail) as u64;
            let (Some(head), Some(tail)) = (
                read_u32(ram, ring + offset_of!(TimelineRing, head) as u64),
                read_u32(ram, tail_at),
            ) else {
                continue;
            };
            // Pairs with the producer's release store of `head`.
            fence(Ordering::Acquire);
            // Every published event happened before this.
            let now = crate::rdtsc();
            let count = head.wrapping_sub(tail).min(TIMELINE_RING_CAPACITY as u32);
            for i in 0..count {
                let index = (tail.wrapping_add(i) as usize) % TIMELINE_RING_CAPACITY;
                let at = ring
                    + offset_of!(TimelineRing, events) as u64
                    + (index * std::mem::size_of::<TimelineEvent>()) as u64;
                match ram.read_struct::<TimelineEvent>(at) {
                    Ok(event) if event.tsc <= now && trace.micros(event.tsc).is_some() => {
                        self.apply(trace, guest, v, &event)
                    }
                    _ => self.skipped += 1,
                }
            }
            // The slots are read: the producer may reuse them.
            fence(Ordering::Release);
            let _ = ram.write_u32(tail_at, head);
        }
    }

    fn apply(&mut self, trace: &Trace, guest: usize, v: u32, e: &TimelineEvent) {
        match TimelineKind::from_raw(e.kind) {
            Some(TimelineKind::SwitchIn) => {
                if let Some(open) = self.running[v as usize].take() {
                    self.emit_slice(trace, guest, v, open, e.tsc, "next switch-in");
                }
                self.running[v as usize] = Some(Slice {
                    thread: e.thread,
                    start: e.tsc,
                    from: self.handed.remove(&e.thread),
                });
            }
            Some(TimelineKind::SwitchOut) => {
                let slot = &mut self.running[v as usize];
                if let Some(open) = slot.filter(|s| s.thread == e.thread) {
                    *slot = None;
                    let reason = SwitchReason::from_raw(e.arg).map_or("?", SwitchReason::name);
                    self.emit_slice(trace, guest, v, open, e.tsc, reason);
                }
                if e.arg == SwitchReason::Exit as u64 {
                    self.names.remove(&e.thread);
                }
            }
            Some(TimelineKind::RecordHandled) => self.emit_record(trace, guest, v, e),
            Some(TimelineKind::ThreadName) => {
                let offset = e.vcpu as usize;
                if offset + 8 <= MAX_NAME {
                    let name = self.names.entry(e.thread).or_insert([0; MAX_NAME]);
                    name[offset..offset + 8].copy_from_slice(&e.arg.to_le_bytes());
                }
            }
            None => self.skipped += 1,
        }
    }

    fn thread_label(&self, thread: u64) -> String {
        let name = self.names.get(&thread).map(|bytes| {
            let len = bytes.iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
            String::from_utf8_lossy(&bytes[..len]).replace(['"', '\\'], "_")
        });
        match name {
            Some(name) if !name.is_empty() => format!("#{thread} {name}"),
            _ => format!("#{thread}"),
        }
    }

    /// Writes `slice` on vCPU `v` ending at `end`, and its incoming arrow; returns its start
    /// and end (us), `None` if it lies outside the trace.
    fn emit_slice(
        &mut self,
        trace: &Trace,
        guest: usize,
        v: u32,
        slice: Slice,
        end: u64,
        reason: &str,
    ) -> Option<(f64, f64)> {
        let start = trace.micros(slice.start)?;
        let end = trace.micros(end.max(slice.start))?;
        let dur = end - start;
        let tid = THREAD_TRACKS + v;
        let label = self.thread_label(slice.thread);
        trace.raw(format_args!(
            "{{\"name\":\"{label}\",\"cat\":\"thread\",\"ph\":\"X\",\"ts\":{start:.3},\"dur\":{dur:.3},\"pid\":{guest},\"tid\":{tid},\"args\":{{\"thread\":{},\"left\":\"{reason}\"}}}}",
            slice.thread
        ));
        if let Some(from) = slice.from {
            self.next_flow += 1;
            let id = (guest as u64) << 48 | self.next_flow;
            let name = format!("{} resumed", from.kind.name());
            trace.raw(format_args!(
                "{{\"name\":\"{name}\",\"cat\":\"context\",\"ph\":\"s\",\"id\":{id},\"ts\":{:.3},\"pid\":{guest},\"tid\":{},\"args\":{{\"thread\":{},\"from_vcpu\":{},\"to_vcpu\":{v}}}}}",
                from.at,
                THREAD_TRACKS + from.vcpu,
                slice.thread,
                from.vcpu
            ));
            trace.raw(format_args!(
                "{{\"name\":\"{name}\",\"cat\":\"context\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"ts\":{:.3},\"pid\":{guest},\"tid\":{tid}}}",
                start + (dur / 2.0).min(0.001)
            ));
        }
        Some((start, end))
    }

    fn emit_record(&mut self, trace: &Trace, guest: usize, v: u32, e: &TimelineEvent) {
        let Some(ts) = trace.micros(e.tsc) else {
            return;
        };
        let (kind, action) = split_record_arg(e.arg);
        let kind = UpcallKind::from_raw(kind).map_or("?", UpcallKind::name);
        let action = RecordAction::from_raw(action).map_or("?", RecordAction::name);
        let thread = if e.thread == 0 {
            "none".to_string()
        } else {
            self.thread_label(e.thread)
        };
        trace.raw(format_args!(
            "{{\"name\":\"{kind} handled\",\"cat\":\"upcall\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts:.3},\"pid\":{guest},\"tid\":{},\"args\":{{\"thread\":\"{thread}\",\"thread_id\":{},\"from_vcpu\":{},\"action\":\"{action}\"}}}}",
            THREAD_TRACKS + v,
            e.thread,
            e.vcpu
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    fn event(kind: TimelineKind, tsc: u64, thread: u64, arg: u64) -> TimelineEvent {
        TimelineEvent {
            tsc,
            kind: kind as u32,
            vcpu: 0,
            thread,
            arg,
        }
    }

    fn state(vcpus: usize) -> State {
        State {
            running: vec![None; vcpus],
            dropped: vec![0; vcpus],
            ..State::default()
        }
    }

    #[test]
    fn a_handed_over_thread_gets_an_arrow_to_where_it_ran_next() {
        let path = crate::testing::TempPath::new("timeline.json");
        let trace = Trace::create(&path, 1_000_000).unwrap();
        let t0 = crate::rdtsc();
        let mut s = state(2);
        let mut name = event(
            TimelineKind::ThreadName,
            t0,
            7,
            u64::from_le_bytes(*b"worker\0\0"),
        );
        name.vcpu = 0;
        s.apply(&trace, 0, 0, &name);
        s.apply(
            &trace,
            0,
            0,
            &event(TimelineKind::SwitchIn, t0 + 1000, 7, 0),
        );
        s.hand_over(&trace, 0, 0, UpcallKind::Preempted, t0 + 5000);
        let mut handled = event(
            TimelineKind::RecordHandled,
            t0 + 6000,
            7,
            protocol::timeline::record_arg(UpcallKind::Preempted as u32, RecordAction::Requeued),
        );
        handled.vcpu = 0;
        s.apply(&trace, 0, 1, &handled);
        s.apply(
            &trace,
            0,
            1,
            &event(TimelineKind::SwitchIn, t0 + 8000, 7, 0),
        );
        s.apply(
            &trace,
            0,
            1,
            &event(
                TimelineKind::SwitchOut,
                t0 + 9000,
                7,
                SwitchReason::Exit as u64,
            ),
        );
        assert_eq!(
            trace.finish().unwrap(),
            5,
            "two slices, an arrow, an instant"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = value["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0]["name"], "#7 worker");
        assert_eq!(slices[0]["tid"], THREAD_TRACKS);
        assert_eq!(slices[0]["args"]["left"], "preempted by the VMM");
        assert_eq!(slices[1]["tid"], THREAD_TRACKS + 1);
        let start = events.iter().find(|e| e["ph"] == "s").unwrap();
        let finish = events.iter().find(|e| e["ph"] == "f").unwrap();
        assert_eq!(start["id"], finish["id"]);
        assert_eq!(start["name"], "PREEMPTED resumed");
        assert_eq!(
            (start["tid"].as_u64(), finish["tid"].as_u64()),
            (Some(1000), Some(1001))
        );
        let instant = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(instant["name"], "PREEMPTED handled");
        assert_eq!(instant["args"]["action"], "requeued");
        // The exit forgot the thread.
        assert!(s.names.is_empty() && s.handed.is_empty());
    }

    #[test]
    fn merge_state_stays_bounded() {
        let path = crate::testing::TempPath::new("timeline-bounded.json");
        let trace = Trace::create(&path, 1_000_000).unwrap();
        let t0 = crate::rdtsc();
        let mut s = state(1);
        for thread in 1..50_000u64 {
            let at = t0 + thread * 10;
            s.apply(
                &trace,
                0,
                0,
                &event(TimelineKind::ThreadName, at, thread, 0x61),
            );
            s.apply(&trace, 0, 0, &event(TimelineKind::SwitchIn, at, thread, 0));
            if thread % 2 == 0 {
                // Preempted, never seen again.
                s.hand_over(&trace, 0, 0, UpcallKind::Preempted, at + 5);
            } else {
                s.apply(
                    &trace,
                    0,
                    0,
                    &event(
                        TimelineKind::SwitchOut,
                        at + 5,
                        thread,
                        SwitchReason::Exit as u64,
                    ),
                );
            }
        }
        assert!(s.handed.len() <= MAX_HANDED);
        assert_eq!(s.names.len(), 24_999, "only the threads that never exited");
        // Unknown kinds are skipped, not kept.
        s.apply(&trace, 0, 0, &event(TimelineKind::SwitchIn, t0, 1, 0));
        let mut bad = event(TimelineKind::SwitchIn, t0, 1, 0);
        bad.kind = 99;
        s.apply(&trace, 0, 0, &bad);
        assert_eq!(s.skipped, 1);
        trace.finish().unwrap();
    }

    #[test]
    fn drain_reads_published_events_moves_the_tail_and_counts_drops() {
        let ram = GuestRam::new(1 << 20).unwrap();
        let rings = 0x1_0000u64;
        let timeline = Timeline::new(2);
        timeline.lock().rings = Some(rings);
        let path = crate::testing::TempPath::new("timeline-drain.json");
        let trace = Trace::create(&path, 1_000_000).unwrap();
        let t0 = crate::rdtsc();
        let ring = ring_addr(rings, 1);
        let events = ring + offset_of!(TimelineRing, events) as u64;
        // The tail starts at 4094: the two events wrap around the end of the ring.
        let tail = TIMELINE_RING_CAPACITY as u32 - 2;
        let ins = [
            event(TimelineKind::SwitchIn, t0 + 10, 3, 0),
            event(
                TimelineKind::SwitchOut,
                t0 + 20,
                3,
                SwitchReason::Park as u64,
            ),
        ];
        for (i, e) in ins.iter().enumerate() {
            let slot = (tail as usize + i) % TIMELINE_RING_CAPACITY;
            ram.write_struct(events + (slot * size_of::<TimelineEvent>()) as u64, e)
                .unwrap();
        }
        ram.write_u32(ring + offset_of!(TimelineRing, tail) as u64, tail)
            .unwrap();
        ram.write_u32(
            ring + offset_of!(TimelineRing, head) as u64,
            tail.wrapping_add(2),
        )
        .unwrap();
        ram.write_u64(ring + offset_of!(TimelineRing, dropped) as u64, 5)
            .unwrap();
        timeline.drain(&ram, &trace, 0);
        assert_eq!(
            read_u32(&ram, ring + offset_of!(TimelineRing, tail) as u64),
            Some(tail.wrapping_add(2))
        );
        assert_eq!(timeline.losses(), Some((5, 0)));
        // Drained once: a second drain finds nothing new.
        timeline.drain(&ram, &trace, 0);
        assert_eq!(trace.finish().unwrap(), 1);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\"tid\":1001") && text.contains("\"left\":\"park\""),
            "{text}"
        );
    }
}
