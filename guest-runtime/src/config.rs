//! Runtime settings. Defaults suit most programs; a guest can change them on the `activm run`
//! command line with arguments the runtime consumes before `main` sees the rest:
//!
//! | argument | meaning | default |
//! |---|---|---|
//! | `--rt-slice-us=N` | preemption time slice | 10000 |
//! | `--rt-idle-spin-us=N` | how long an idle vCPU spins before it halts | 50 |
//! | `--rt-sa=on\|off` | use scheduler activations when the VMM offers them | on |
//! | `--rt-halt=on\|off` | halt idle vCPUs (off: keep spinning) | on |
//! | `--rt-idle-yield-us=N` | with activations: how long a vCPU halts idle before it gives its processor back to the VMM (`sa_yield`; 0: never) | 1000 |
//! | `--rt-blk-async=on\|off` | block requests through the VMM's completion ring when it offers one (the vCPU never blocks) | on |
//! | `--rt-blk-ring=on\|off` | with asynchronous block requests: submit through the VMM's submission ring when it offers one (no exit while the VMM looks at the ring on its own; off: one `blk_submit` exit each) | on |
//! | `--rt-blk-doorbell-exit=on\|off` | with the submission ring's consumer asleep, take the request back and submit it with `blk_submit`'s exit (which completes a page-cache read inside it) instead of ringing the doorbell with an in-kernel store (a wake-up of the VMM's consumer thread) | on |
//! | `--rt-blk-nudge-us=N` | with asynchronous block requests: ask the VMM to interrupt a busy vCPU when a completion waits this long (0: only idle vCPUs are interrupted) | 500 |
//! | `--rt-stats=on` | print the runtime's counters when `main` returns | off |
//! | `--rt-poison-stacks=on` | testing: fill activation stacks given back to the pool, end the guest when one is used before it is handed out again (`activation::poison`) | off |
//!
//! or from code, with the setters below.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;

use crate::percpu::ns_to_ticks;

static SLICE_NS: AtomicU64 = AtomicU64::new(10_000_000);
static IDLE_SPIN_NS: AtomicU64 = AtomicU64::new(50_000);
static USE_SA: AtomicBool = AtomicBool::new(true);
static USE_HALT: AtomicBool = AtomicBool::new(true);
static USE_BLK_ASYNC: AtomicBool = AtomicBool::new(true);
static USE_BLK_RING: AtomicBool = AtomicBool::new(true);
static BLK_DOORBELL_EXIT: AtomicBool = AtomicBool::new(true);
static BLK_NUDGE_US: AtomicU64 = AtomicU64::new(500);
static IDLE_YIELD_NS: AtomicU64 = AtomicU64::new(1_000_000);
static PRINT_STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);
/// Random preemption (tests): min and max period in ns, 0 = off.
static RANDOM_MIN_NS: AtomicU64 = AtomicU64::new(0);
static RANDOM_MAX_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the time slice (default 10 ms).
pub fn set_time_slice(slice: Duration) {
    SLICE_NS.store((slice.as_nanos() as u64).max(50_000), Ordering::Relaxed);
}

pub fn time_slice() -> Duration {
    Duration::from_nanos(SLICE_NS.load(Ordering::Relaxed))
}

pub(crate) fn slice_ticks() -> u64 {
    ns_to_ticks(SLICE_NS.load(Ordering::Relaxed))
}

/// Sets how long an idle vCPU spins before halting (default 50 us).
pub fn set_idle_spin(spin: Duration) {
    IDLE_SPIN_NS.store(spin.as_nanos() as u64, Ordering::Relaxed);
}

pub(crate) fn idle_spin_ticks() -> u64 {
    ns_to_ticks(IDLE_SPIN_NS.load(Ordering::Relaxed))
}

pub(crate) fn use_sa() -> bool {
    USE_SA.load(Ordering::Relaxed)
}

/// Whether block requests use the VMM's asynchronous ring when offered (default on; takes
/// effect before the first request).
pub fn set_blk_async(on: bool) {
    USE_BLK_ASYNC.store(on, Ordering::Relaxed);
}

pub(crate) fn use_blk_async() -> bool {
    USE_BLK_ASYNC.load(Ordering::Relaxed)
}

/// Whether asynchronous block requests go through the VMM's submission ring when offered
/// (default on: while the VMM looks at it on its own, a request costs no exit; takes effect
/// before the first request).
pub fn set_blk_ring(on: bool) {
    USE_BLK_RING.store(on, Ordering::Relaxed);
}

pub(crate) fn use_blk_ring() -> bool {
    USE_BLK_RING.load(Ordering::Relaxed)
}

/// Whether the submission ring's doorbell is the `blk_doorbell` hypercall (an exit, which
/// takes the ring in place) rather than the in-kernel store, which wakes the VMM's consumer
/// thread (default on: the exit costs less than that wake-up and answers a fast device at
/// once).
pub fn set_blk_doorbell_exit(on: bool) {
    BLK_DOORBELL_EXIT.store(on, Ordering::Relaxed);
}

pub(crate) fn blk_doorbell_exit() -> bool {
    BLK_DOORBELL_EXIT.load(Ordering::Relaxed)
}

/// How long a block completion may wait before a busy vCPU is interrupted for it (`None`:
/// never; default 500 us; takes effect before the first request).
pub fn set_blk_nudge(after: Option<Duration>) {
    BLK_NUDGE_US.store(after.map_or(0, |d| d.as_micros() as u64), Ordering::Relaxed);
}

pub(crate) fn blk_nudge_us() -> u32 {
    BLK_NUDGE_US.load(Ordering::Relaxed).min(1_000_000) as u32
}

pub(crate) fn use_halt() -> bool {
    USE_HALT.load(Ordering::Relaxed)
}

/// With activations: how long an idle vCPU halts before it gives its processor back to the
/// VMM (`None`: it never does).
pub fn set_idle_yield(after: Option<Duration>) {
    IDLE_YIELD_NS.store(after.map_or(0, |d| d.as_nanos() as u64), Ordering::Relaxed);
}

/// [`set_idle_yield`]'s value, in TSC ticks (0: never).
pub(crate) fn idle_yield_ticks() -> u64 {
    ns_to_ticks(IDLE_YIELD_NS.load(Ordering::Relaxed))
}

/// Test mode: every vCPU's timer fires after a random period in `[min, max)` and preempts the
/// running thread whenever another is runnable (`None` turns it off).
pub fn set_random_preemption(range: Option<(Duration, Duration)>) {
    let (min, max) = range.map_or((0, 0), |(a, b)| {
        (
            a.as_nanos() as u64,
            (b.as_nanos() as u64).max(a.as_nanos() as u64 + 1),
        )
    });
    RANDOM_MIN_NS.store(min, Ordering::Relaxed);
    RANDOM_MAX_NS.store(max, Ordering::Relaxed);
}

/// Prints the runtime's counters when `main` returns (`crate::stats::set_print_at_exit`).
pub(crate) fn set_print_stats_at_exit(on: bool) {
    PRINT_STATS_AT_EXIT.store(on, Ordering::Relaxed);
}

/// Whether the counters are printed when `main` returns.
pub(crate) fn print_stats_at_exit() -> bool {
    PRINT_STATS_AT_EXIT.load(Ordering::Relaxed)
}

/// The random preemption range in ns, if on.
pub(crate) fn random_preemption() -> Option<(u64, u64)> {
    let max = RANDOM_MAX_NS.load(Ordering::Relaxed);
    (max != 0).then(|| (RANDOM_MIN_NS.load(Ordering::Relaxed), max))
}

fn parse_on_off(value: &str) -> Option<bool> {
    match value {
        "on" | "1" | "yes" | "true" => Some(true),
        "off" | "0" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// Applies one `--rt-*` argument; false if `arg` is not one.
pub(crate) fn apply_arg(arg: &str) -> bool {
    let Some(rest) = arg.strip_prefix("--rt-") else {
        return false;
    };
    let (key, value) = rest.split_once('=').unwrap_or((rest, ""));
    let num = value.parse::<u64>().ok();
    match (key, num, parse_on_off(value)) {
        ("slice-us", Some(us), _) => set_time_slice(Duration::from_micros(us)),
        ("idle-spin-us", Some(us), _) => set_idle_spin(Duration::from_micros(us)),
        ("sa", _, Some(on)) => USE_SA.store(on, Ordering::Relaxed),
        ("halt", _, Some(on)) => USE_HALT.store(on, Ordering::Relaxed),
        ("blk-async", _, Some(on)) => set_blk_async(on),
        ("blk-ring", _, Some(on)) => set_blk_ring(on),
        ("blk-doorbell-exit", _, Some(on)) => set_blk_doorbell_exit(on),
        ("blk-nudge-us", Some(us), _) => set_blk_nudge((us > 0).then(|| Duration::from_micros(us))),
        ("idle-yield-us", Some(us), _) => {
            set_idle_yield((us > 0).then(|| Duration::from_micros(us)))
        }
        ("stats", _, Some(on)) => set_print_stats_at_exit(on),
        ("poison-stacks", _, Some(on)) => crate::activation::poison::set(on),
        _ => activm_stub::println!("activm-rt: ignoring unknown runtime argument {arg:?}"),
    }
    true
}
