//! Testing only: `--preempt-at SYMBOL[+OFFSET][,...]` takes a vCPU's processor exactly when it
//! reaches one of these guest code addresses, through the normal hand-off (its context in a
//! PREEMPTED record, the processor given back to the allocator), at most `--preempt-at-count`
//! times in all. It makes on demand the interleavings that otherwise need the VMM to take a vCPU
//! in a window a few instructions wide (docs/activations.md, "Preempting at an address").
//!
//! How a vCPU is stopped at an address is the architecture's (`arch::current::preempt`): on
//! x86_64 a breakpoint instruction written there, whose trap the VMM catches at the guest's
//! own #BP gate. The original byte goes back at the first hit, so the vCPU resumes on the
//! original instruction; a point is armed again [`REARM_AFTER`] later while hits are left (a
//! context taken there and not yet resumed by then is simply taken again when it is).
//! Addresses must be CPL3 code of the image (the guest runtime's, not the stub's CPL0 paths).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::arch::current::preempt::BREAKPOINT;
use crate::error::Error;
use crate::loader::ImageInfo;
use crate::memory::GuestRam;

pub mod elf;

/// How long a point stays disarmed after a hit.
pub const REARM_AFTER: Duration = Duration::from_millis(2);

/// One place to preempt at, as given: a symbol of the image (or `0x` and an address) and an
/// offset in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    pub symbol: String,
    pub offset: u64,
}

/// What `--preempt-at` and `--preempt-at-count` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub points: Vec<Point>,
    /// Preemptions in all, over every point.
    pub count: u32,
}

fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `SYMBOL[+OFFSET][,...]`: OFFSET decimal or `0x` hex; SYMBOL may be `0x` and an address.
pub fn parse_points(text: &str) -> Result<Vec<Point>, String> {
    text.split(',')
        .map(|item| {
            let (symbol, offset) = match item.rsplit_once('+') {
                Some((symbol, offset)) => (
                    symbol,
                    parse_number(offset).ok_or_else(|| format!("bad offset in {item:?}"))?,
                ),
                None => (item, 0),
            };
            if symbol.is_empty() {
                return Err(format!("no symbol in {item:?}"));
            }
            Ok(Point {
                symbol: symbol.to_string(),
                offset,
            })
        })
        .collect()
}

#[derive(Debug)]
struct Armed {
    name: String,
    addr: u64,
    original: u8,
    armed: bool,
    disarmed_at: Option<Instant>,
    hits: u32,
}

#[derive(Debug)]
struct State {
    points: Vec<Armed>,
    left: u32,
    /// Traps on a point taken after the last preemption (they resume on the original).
    passed: u32,
}

/// What a trap on a breakpoint means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trap {
    /// Not one of ours: the guest's own `int3`.
    NotOurs,
    /// Take the vCPU's processor here.
    Preempt,
    /// No preemption left: resume on the original instruction.
    Pass,
}

/// The resolved points of one guest and what is left of the budget.
#[derive(Debug)]
pub struct Hooks {
    gate: u64,
    state: Mutex<State>,
    /// Some point waits to be armed again.
    idle: AtomicBool,
}

impl Hooks {
    /// Resolve `spec` against the loaded `image` (its symbols; every address in a loaded
    /// segment and outside the stub's vectors `[vectors, vectors_end)`) and arm every point.
    pub fn arm(
        spec: &Spec,
        image: &Path,
        info: &ImageInfo,
        ram: &GuestRam,
        vectors: std::ops::Range<u64>,
        gate: u64,
    ) -> Result<Hooks, Error> {
        let bad = |what: String| Error::Config(format!("--preempt-at: {what}"));
        let elf = std::fs::read(image)
            .map_err(|e| bad(format!("cannot read {}: {e}", image.display())))?;
        let mut points: Vec<Armed> = Vec::new();
        for point in &spec.points {
            let base = match point.symbol.strip_prefix("0x") {
                Some(_) => parse_number(&point.symbol)
                    .ok_or_else(|| bad(format!("bad address {}", point.symbol)))?,
                None => {
                    elf::lookup(&elf, &point.symbol)
                        .map_err(|why| bad(format!("{why} in {}", image.display())))?
                        .value
                }
            };
            let name = match point.offset {
                0 => point.symbol.clone(),
                off => format!("{}+{off:#x}", point.symbol),
            };
            let addr = base
                .checked_add(point.offset)
                .ok_or_else(|| bad(format!("{name} overflows")))?;
            let loaded = info
                .segments
                .iter()
                .any(|&(_, gpa, filesz, _)| addr >= gpa && addr - gpa < filesz);
            if !loaded || vectors.contains(&addr) {
                return Err(bad(format!(
                    "{name} ({addr:#x}) is not CPL3 code of the image"
                )));
            }
            if points.iter().any(|p| p.addr == addr) {
                continue;
            }
            let original = ram.read_bytes(addr, 1)?[0];
            points.push(Armed {
                name,
                addr,
                original,
                armed: false,
                disarmed_at: None,
                hits: 0,
            });
        }
        for p in &mut points {
            ram.write_bytes(p.addr, &[BREAKPOINT])?;
            p.armed = true;
        }
        Ok(Hooks {
            gate,
            state: Mutex::new(State {
                points,
                left: spec.count,
                passed: 0,
            }),
            idle: AtomicBool::new(false),
        })
    }

    /// The guest address whose debug exit means a breakpoint trap.
    pub fn gate(&self) -> u64 {
        self.gate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A vCPU trapped on the breakpoint at `addr`: put the original byte back (the vCPU
    /// resumes on it) and say whether to preempt it.
    pub fn on_trap(&self, ram: &GuestRam, addr: u64) -> Trap {
        let mut state = self.lock();
        let Some(i) = state.points.iter().position(|p| p.addr == addr) else {
            return Trap::NotOurs;
        };
        let now = Instant::now();
        disarm(ram, &mut state.points[i], now);
        // Not armed again under the context now resuming on it (a trap that raced the disarm).
        state.points[i].disarmed_at = Some(now);
        if state.left == 0 {
            state.passed += 1;
            return Trap::Pass;
        }
        state.left -= 1;
        state.points[i].hits += 1;
        if state.left == 0 {
            state.points.iter_mut().for_each(|p| disarm(ram, p, now));
            self.idle.store(false, Ordering::Relaxed);
        } else {
            self.idle.store(true, Ordering::Relaxed);
            rearm_due(ram, &mut state, now);
        }
        Trap::Preempt
    }

    /// Arm again the points disarmed [`REARM_AFTER`] ago or more, while preemptions are left
    /// (called at every kick: a lock only while some point waits).
    pub fn rearm_due(&self, ram: &GuestRam) {
        if !self.idle.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.lock();
        let waiting = rearm_due(ram, &mut state, Instant::now());
        self.idle.store(waiting, Ordering::Relaxed);
    }

    /// `preempt-at: N preemptions (POINT HITS, ...), M traps passed on`.
    pub fn summary(&self) -> String {
        let state = self.lock();
        let total: u32 = state.points.iter().map(|p| p.hits).sum();
        let each: Vec<String> = state
            .points
            .iter()
            .map(|p| format!("{} {}", p.name, p.hits))
            .collect();
        format!(
            "preempt-at: {total} preemptions ({}), {} traps passed on",
            each.join(", "),
            state.passed
        )
    }
}

fn disarm(ram: &GuestRam, p: &mut Armed, now: Instant) {
    if p.armed {
        // A one-byte store: another vCPU fetches the breakpoint or the original, never a mix.
        // The address was read at arming, so the write cannot fail.
        let _ = ram.write_bytes(p.addr, &[p.original]);
        p.armed = false;
        p.disarmed_at = Some(now);
    }
}

/// Arm the points that are due; whether some point still waits.
fn rearm_due(ram: &GuestRam, state: &mut State, now: Instant) -> bool {
    if state.left == 0 {
        return false;
    }
    let mut waiting = false;
    for p in state.points.iter_mut().filter(|p| !p.armed) {
        if p.disarmed_at
            .is_some_and(|at| now.duration_since(at) >= REARM_AFTER)
        {
            let _ = ram.write_bytes(p.addr, &[BREAKPOINT]);
            p.armed = true;
        } else {
            waiting = true;
        }
    }
    waiting
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse() {
        let points = parse_points("__rt_release_left_stack,adopt+0x26c,f+12").unwrap();
        assert_eq!(points.len(), 3);
        assert_eq!(points[0].offset, 0);
        assert_eq!(points[1].symbol, "adopt");
        assert_eq!(points[1].offset, 0x26c);
        assert_eq!(points[2].offset, 12);
        assert!(parse_points("f+zz").is_err());
        assert!(parse_points("+4").is_err());
        assert!(parse_points("a,,b").is_err());
    }
}
