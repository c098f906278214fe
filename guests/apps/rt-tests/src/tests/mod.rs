//! The tests. Each returns `Ok(detail)` or `Err(reason)`; `ALL` lists them by name.

mod blk;
mod modes;
mod random;
mod sched;
mod soak;
mod sync;
mod threads;
mod upcalls;

pub use modes::{deadlock_mode, fault_mode, overflow_mode, panic_mode, watchdog_lost_report_mode};
pub use soak::chaos_soak;

use alloc::string::String;
use core::sync::atomic::Ordering;
use core::time::Duration;

use activm_rt::rt;
use activm_rt::thread;
use activm_rt::upcall;
use activm_stub::protocol::shared::UpcallKind;

use crate::{Needs, TestResult};

pub type TestFn = fn() -> TestResult;

pub static ALL: &[(&str, Needs, TestFn)] = &[
    ("spawn-join-10000", Needs::Any, threads::spawn_join_10000),
    ("builder", Needs::Any, threads::builder),
    ("mutex", Needs::Any, sync::mutex),
    ("condvar", Needs::Any, sync::condvar),
    ("condvar-timeout", Needs::Any, sync::condvar_timeout),
    ("rwlock", Needs::Any, sync::rwlock),
    ("semaphore", Needs::Any, sync::semaphore),
    ("barrier", Needs::Any, sync::barrier),
    ("mpsc", Needs::Any, sync::mpsc_channels),
    ("thread-local", Needs::Any, threads::thread_local),
    ("park-unpark", Needs::Any, threads::park_unpark),
    ("std-thread-api", Needs::Any, crate::std_native::thread_api),
    ("random", Needs::Any, random::random_bytes),
    (
        "std-cases-preempted",
        Needs::Any,
        crate::std_native::std_cases_preempted,
    ),
    ("fp-preemption", Needs::Any, sched::fp_preemption),
    ("fp-control-decoder", Needs::Any, sched::fp_control_decoder),
    (
        "exception-context-rewind",
        Needs::Any,
        crate::handover::exception_context_rewind,
    ),
    ("sleep-accuracy", Needs::Any, sched::sleep_accuracy),
    ("time-slicing", Needs::Any, sched::time_slicing),
    ("heap-stack", Needs::Any, sched::heap_stack),
    ("stack-cache-shared", Needs::Any, sched::stack_cache_shared),
    ("random-preemption", Needs::Any, sched::random_preemption),
    ("upcall-newproc", Needs::Sim, upcalls::upcall_newproc),
    ("upcall-user", Needs::Sim, upcalls::upcall_user),
    ("upcall-signal", Needs::Sim, upcalls::upcall_signal),
    ("upcall-preempted", Needs::Sim, upcalls::upcall_preempted),
    (
        "upcall-preempted-rseq",
        Needs::Sim,
        upcalls::upcall_preempted_rseq,
    ),
    (
        "upcall-continuation",
        Needs::Sim,
        upcalls::upcall_continuation,
    ),
    ("upcall-blocked", Needs::Sim, upcalls::upcall_blocked),
    ("sa-real", Needs::Activations, upcalls::sa_real),
    ("sa-chaos", Needs::Activations, upcalls::sa_chaos),
    ("idle-yield", Needs::Activations, blk::idle_yield),
    ("refill-busy", Needs::Activations, upcalls::refill_busy),
    ("blk", Needs::Disk, blk::blk),
    ("blk-overlap", Needs::Disk, blk::blk_overlap),
];

pub(super) fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

pub(super) fn ms(ticks: u64) -> u64 {
    rt::ticks_to_ns(ticks) / 1_000_000
}

/// Waits (yielding / sleeping) until `cond`, at most `timeout`.
pub(super) fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = rt::rdtsc() + timeout.as_micros() as u64 * rt::tsc_khz() / 1000;
    while !cond() {
        if rt::rdtsc() > deadline {
            return false;
        }
        thread::sleep(Duration::from_micros(200));
    }
    true
}

pub(super) fn kind_count(kind: UpcallKind) -> u64 {
    upcall::BY_KIND[kind as usize].load(Ordering::Acquire)
}

/// TSC ticks in `ns` nanoseconds.
pub(super) fn ns_ticks(ns: u64) -> u64 {
    ns / 1000 * rt::tsc_khz() / 1000
}

pub(super) fn since_ns(t0: u64) -> u64 {
    rt::ticks_to_ns(rt::rdtsc() - t0)
}
