//! The guest runtime's threads and run queues as its self-description (`protocol::diag`) says
//! they are, read from guest memory for the hang report. Nothing read is trusted: every
//! address is checked against RAM, the thread list is walked at most [`MAX_TCBS`] entries and
//! stops at one it saw already, names are clamped and made printable.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::ops::Range;

use protocol::diag::{
    RuntimeDiag, TcbLayout, VcpuDiag, DIAG_MAGIC, EVENT_NAMES, TCB_FLAG_BLOCKED_IN_VMM,
    TCB_FLAG_MAIN, WAKE_PARKED, WAKE_WAITING, WAKE_WOKEN,
};
use protocol::MAX_VCPUS;

use crate::memory::GuestRam;

/// TCBs walked at most (the list holds every TCB ever allocated, free ones too: `rt-tests`
/// leaves over 4,096; this many take ~0.1 s to read).
pub const MAX_TCBS: usize = 1 << 18;
/// Threads listed at most; the rest are counted.
pub const MAX_LISTED: usize = 64;
/// Bytes of a name shown at most.
const MAX_NAME: u64 = 48;
/// Words of a switched-out thread's stack looked at for code addresses.
const STACK_WORDS: u64 = 48;
/// Code addresses shown per thread.
const MAX_CODE_WORDS: usize = 6;
/// A TCB larger than this is not believed.
const MAX_TCB_SIZE: u32 = 4096;

/// What the report needs besides guest memory.
#[derive(Clone, Debug)]
pub struct Context {
    /// The guest's `SharedHeader::runtime_diag` word.
    pub table: u64,
    pub nr_vcpus: u32,
    /// Where the guest image lies: words of a stack inside it are likely return addresses.
    pub image: Range<u64>,
    /// The TSC now and its rate (0: unknown), to say when a deadline is due.
    pub now_tsc: u64,
    pub tsc_khz: u64,
    /// TCBs walked at most ([`MAX_TCBS`]).
    pub max_tcbs: usize,
}

/// Little-endian fields of bytes read from the guest.
struct Bytes(Vec<u8>);

impl Bytes {
    fn u32(&self, at: usize) -> u32 {
        self.0
            .get(at..at + 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&self, at: usize) -> u64 {
        self.0
            .get(at..at + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

fn read_u32(ram: &GuestRam, at: u64) -> Option<u32> {
    let b = ram.read_bytes(at, 4).ok()?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// What the runtime says of a vCPU's one-shot timer, for the interrupt watch (`vcpu/nudge.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerWord {
    /// No valid table is published (a guest without the runtime, or garbage): nothing known.
    Unknown,
    NotArmed,
    /// Armed for this TSC deadline.
    Armed(u64),
}

/// vCPU `vcpu`'s timer word, read through the table at `table` (three reads of guest memory:
/// the magic, the word's address, the word). A hint only: a hostile guest can make its own
/// vCPUs looked at more or less often, nothing else.
pub fn timer_word(ram: &GuestRam, table: u64, vcpu: u32) -> TimerWord {
    if table == 0 || vcpu as usize >= MAX_VCPUS {
        return TimerWord::Unknown;
    }
    if ram
        .read_u64(table.wrapping_add(offset_of!(RuntimeDiag, magic) as u64))
        .ok()
        != Some(DIAG_MAGIC)
    {
        return TimerWord::Unknown;
    }
    let field = offset_of!(RuntimeDiag, vcpus)
        + vcpu as usize * size_of::<VcpuDiag>()
        + offset_of!(VcpuDiag, timer);
    let word = ram
        .read_u64(table.wrapping_add(field as u64))
        .and_then(|at| ram.read_u64(at));
    match word {
        Ok(0) => TimerWord::NotArmed,
        Ok(at) => TimerWord::Armed(at),
        Err(_) => TimerWord::Unknown,
    }
}

/// One thread as read from its TCB.
struct Thread {
    at: u64,
    id: u64,
    name: String,
    wake: u32,
    event: u32,
    flags: u32,
    sp: u64,
    sleep: u64,
}

/// The runtime's threads and queues as text (one line each), or why there are none.
pub fn describe(ram: &GuestRam, cx: &Context) -> String {
    if cx.table == 0 {
        return "guest runtime: no thread table published".into();
    }
    let Ok(bytes) = ram.read_bytes(cx.table, size_of::<RuntimeDiag>() as u64) else {
        return format!(
            "guest runtime: thread table address {:#x} is outside RAM",
            cx.table
        );
    };
    let table = Bytes(bytes);
    if table.u64(offset_of!(RuntimeDiag, magic)) != DIAG_MAGIC
        || table.u32(offset_of!(RuntimeDiag, size)) != size_of::<RuntimeDiag>() as u32
    {
        return format!(
            "guest runtime: no valid thread table at {:#x} (magic or size differ)",
            cx.table
        );
    }
    let tcb = tcb_layout(&table);
    let Some(tcb) = tcb else {
        return "guest runtime: thread table has an impossible TCB layout".into();
    };
    let threads = walk(ram, &table, &tcb, cx.max_tcbs);
    let ids: HashMap<u64, u64> = threads.list.iter().map(|t| (t.at, t.id)).collect();
    let nr = table
        .u32(offset_of!(RuntimeDiag, nr_vcpus))
        .min(cx.nr_vcpus)
        .min(MAX_VCPUS as u32);
    let mut out = String::new();
    let mut running: HashMap<u64, u32> = HashMap::new();
    for v in 0..nr {
        let base = offset_of!(RuntimeDiag, vcpus) + v as usize * size_of::<VcpuDiag>();
        let word = |field: usize| ram.read_u64(table.u64(base + field)).ok();
        let current = word(offset_of!(VcpuDiag, current));
        if let Some(current) = current.filter(|&c| c != 0) {
            running.insert(current, v);
        }
        let head = read_u32(ram, table.u64(base + offset_of!(VcpuDiag, runq_head)));
        let tail = read_u32(ram, table.u64(base + offset_of!(VcpuDiag, runq_tail)));
        let runq = match (head, tail) {
            (Some(h), Some(t)) => t.wrapping_sub(h).to_string(),
            _ => "?".into(),
        };
        out += &format!(
            "runtime vCPU {v}: {}; in scheduler {}, idle {}; timer {}; run queue {runq}, next {}\n",
            match current {
                Some(0) => "no thread (scheduler)".into(),
                Some(c) => format!("thread {}", thread_name(&ids, c)),
                None => "current thread unreadable".into(),
            },
            flag(word(offset_of!(VcpuDiag, in_sched))),
            flag(word(offset_of!(VcpuDiag, idle))),
            match word(offset_of!(VcpuDiag, timer)) {
                Some(0) => "not armed".into(),
                Some(at) => format!("armed, {}", due(at, cx)),
                None => "?".into(),
            },
            match word(offset_of!(VcpuDiag, runq_next)) {
                Some(0) => "none".into(),
                Some(t) => thread_name(&ids, t),
                None => "?".into(),
            },
        );
    }
    let global = |field: usize| {
        ram.read_u64(table.u64(field))
            .map_or("?".into(), |v| format!("{v:#x}"))
    };
    out += &format!(
        "runtime: halted vCPUs {}, spinning vCPUs {}, global run queue {}\n",
        global(offset_of!(RuntimeDiag, halted)),
        global(offset_of!(RuntimeDiag, spinning)),
        ram.read_u64(table.u64(offset_of!(RuntimeDiag, global_len)))
            .map_or("?".into(), |v| v.to_string()),
    );
    let mut exited = 0;
    let mut listed = 0;
    for t in &threads.list {
        if event_name(t.event) == "exited" && !running.contains_key(&t.at) {
            exited += 1;
            continue;
        }
        if listed == MAX_LISTED {
            continue;
        }
        listed += 1;
        out += &thread_line(ram, t, running.get(&t.at).copied(), cx);
        out.push('\n');
    }
    let unlisted = threads.list.len() - exited - listed;
    out += &format!(
        "runtime: {} live threads ({listed} listed above, {unlisted} not), {exited} exited but not joined{}",
        threads.list.len() - exited,
        threads.stopped.map_or(String::new(), |why| format!("; thread list {why}")),
    );
    out
}

fn flag(word: Option<u64>) -> &'static str {
    match word {
        Some(0) => "no",
        Some(_) => "yes",
        None => "?",
    }
}

fn thread_name(ids: &HashMap<u64, u64>, at: u64) -> String {
    match ids.get(&at) {
        Some(id) => format!("#{id}"),
        None => format!("at {at:#x} (not in the thread list)"),
    }
}

fn event_name(event: u32) -> &'static str {
    EVENT_NAMES
        .get((event >> 8) as usize)
        .copied()
        .unwrap_or("?")
}

/// When TSC deadline `at` is due, from now.
fn due(at: u64, cx: &Context) -> String {
    let ms = |ticks: u64| match ticks.checked_div(cx.tsc_khz) {
        Some(ms) => format!("{ms} ms"),
        None => format!("{ticks} TSC ticks"),
    };
    if at >= cx.now_tsc {
        format!("due in {}", ms(at - cx.now_tsc))
    } else {
        format!("OVERDUE by {}", ms(cx.now_tsc - at))
    }
}

fn tcb_layout(table: &Bytes) -> Option<TcbLayout> {
    let base = offset_of!(RuntimeDiag, tcb);
    let f = |field: usize| table.u32(base + field);
    let layout = TcbLayout {
        size: f(offset_of!(TcbLayout, size)),
        next: f(offset_of!(TcbLayout, next)),
        id: f(offset_of!(TcbLayout, id)),
        refs: f(offset_of!(TcbLayout, refs)),
        wake: f(offset_of!(TcbLayout, wake)),
        event: f(offset_of!(TcbLayout, event)),
        flags: f(offset_of!(TcbLayout, flags)),
        sp: f(offset_of!(TcbLayout, sp)),
        sleep: f(offset_of!(TcbLayout, sleep)),
        name_ptr: f(offset_of!(TcbLayout, name_ptr)),
        name_len: f(offset_of!(TcbLayout, name_len)),
        name_delta: f(offset_of!(TcbLayout, name_delta)),
    };
    let words = [
        layout.next,
        layout.id,
        layout.sp,
        layout.sleep,
        layout.name_ptr,
        layout.name_len,
    ];
    let halves = [layout.refs, layout.wake, layout.event, layout.flags];
    let fits = |off: u32, width: u32| off.checked_add(width).is_some_and(|e| e <= layout.size);
    (layout.size <= MAX_TCB_SIZE
        && words.iter().all(|&o| fits(o, 8))
        && halves.iter().all(|&o| fits(o, 4)))
    .then_some(layout)
}

struct Walk {
    /// Live TCBs (references held), in list order.
    list: Vec<Thread>,
    /// Why the walk stopped before the list's end, if it did.
    stopped: Option<String>,
}

fn walk(ram: &GuestRam, table: &Bytes, tcb: &TcbLayout, max_tcbs: usize) -> Walk {
    let mut list = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let head = table.u64(offset_of!(RuntimeDiag, threads));
    let mut at = match ram.read_u64(head) {
        Ok(at) => at,
        Err(_) => {
            return Walk {
                list,
                stopped: Some(format!("head {head:#x} is outside RAM")),
            }
        }
    };
    let mut stopped = None;
    while at != 0 {
        if seen.len() == max_tcbs {
            stopped = Some(format!("cut after {max_tcbs} entries"));
            break;
        }
        if !seen.insert(at) {
            stopped = Some(format!("loops back to {at:#x}"));
            break;
        }
        let Ok(bytes) = ram.read_bytes(at, u64::from(tcb.size)) else {
            stopped = Some(format!("leaves RAM at {at:#x}"));
            break;
        };
        let b = Bytes(bytes);
        let f = |off: u32| off as usize;
        if b.u32(f(tcb.refs)) != 0 {
            list.push(Thread {
                at,
                id: b.u64(f(tcb.id)),
                name: name(ram, &b, tcb),
                wake: b.u32(f(tcb.wake)),
                event: b.u32(f(tcb.event)),
                flags: b.u32(f(tcb.flags)),
                sp: b.u64(f(tcb.sp)),
                sleep: b.u64(f(tcb.sleep)),
            });
        }
        at = b.u64(f(tcb.next));
    }
    Walk { list, stopped }
}

/// A thread's name, clamped and with anything unprintable replaced (empty: none).
fn name(ram: &GuestRam, tcb_bytes: &Bytes, tcb: &TcbLayout) -> String {
    if tcb.name_ptr == 0 || tcb.name_len == 0 {
        return String::new();
    }
    let ptr = tcb_bytes.u64(tcb.name_ptr as usize);
    if ptr == 0 {
        return String::new();
    }
    let len = tcb_bytes.u64(tcb.name_len as usize);
    let text = ptr.wrapping_add(u64::from(tcb.name_delta));
    match ram.read_bytes(text, len.min(MAX_NAME)) {
        Ok(bytes) => {
            let mut s: String = String::from_utf8_lossy(&bytes)
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            if len > MAX_NAME {
                s += "...";
            }
            s
        }
        Err(_) => format!("(name at {text:#x} outside RAM)"),
    }
}

fn thread_line(ram: &GuestRam, t: &Thread, running_on: Option<u32>, cx: &Context) -> String {
    let mut line = format!("thread #{}", t.id);
    if !t.name.is_empty() {
        line += &format!(" '{}'", t.name);
    }
    if t.flags & TCB_FLAG_MAIN != 0 {
        line += " (main)";
    }
    let event = event_name(t.event);
    let state = match running_on {
        Some(v) => format!("running on vCPU {v}"),
        None if event == "parked" && t.wake == WAKE_PARKED => "blocked (parked)".into(),
        None if event == "parked" && t.wake == WAKE_WAITING => "parking".into(),
        None if event == "parked" && t.wake == WAKE_WOKEN => "woken, not yet queued".into(),
        None if matches!(event, "queued" | "global" | "next" | "spawned" | "resumed") => {
            "runnable".into()
        }
        None => "switched out".into(),
    };
    line += &format!(
        ": {state}; last event {event} on vCPU {}, wake word {}",
        t.event & 0xff,
        match t.wake {
            WAKE_WAITING => "WAITING",
            WAKE_WOKEN => "WOKEN",
            WAKE_PARKED => "PARKED",
            _ => "?",
        }
    );
    if t.flags & TCB_FLAG_BLOCKED_IN_VMM != 0 {
        line += ", blocked in the VMM";
    }
    if t.sleep != 0 {
        line += &format!(", sleeping: {}", due(t.sleep, cx));
    }
    if running_on.is_none() {
        let code = code_words(ram, t.sp, &cx.image);
        if !code.is_empty() {
            line += &format!(", code addresses on its stack (sp {:#x}): {code}", t.sp);
        }
    }
    line
}

/// The first words of a stack that point into the image: likely return addresses.
fn code_words(ram: &GuestRam, sp: u64, image: &Range<u64>) -> String {
    let Ok(bytes) = ram.read_bytes(sp, STACK_WORDS * 8) else {
        return String::new();
    };
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .filter(|w| image.contains(w))
        .take(MAX_CODE_WORDS)
        .map(|w| format!("{w:#x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
