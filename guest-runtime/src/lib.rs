//! **activm-rt**: the guest thread runtime of activm. M:N user threads on the VMM's vCPUs, which
//! are scheduler activations; everything runs at CPL3, and no common thread operation ever
//! exits to the VMM (see `docs/runtime.md` for the design).
//!
//! The API is shaped like std so code ports easily:
//! * [`thread`]: `spawn`, `Builder` (name, stack size), `JoinHandle::join`, `scope`,
//!   `yield_now`, `sleep`, `current`, `park`/`park_timeout`/`unpark`,
//!   `available_parallelism`; [`thread_local!`] and `LocalKey`;
//! * [`sync`]: `Mutex`, `Condvar`, `RwLock`, `Barrier`, `Once`, `OnceLock`, `LazyLock`,
//!   `Semaphore`, `mpsc::{channel, sync_channel}`, `Arc`;
//! * [`time`]: `Instant`, `Duration`; [`io`]: the error type of the calls where std's return
//!   an `io::Result`;
//! * [`main!`]: the app's entry, `activm_rt::main!(main);` with `fn main(args: &[&str]) -> i32`.
//!   vCPU 0 runs `main` as the first thread, every vCPU runs the scheduler, and the guest exits
//!   with `main`'s value when it returns.
//!
//! * [`blk`]: the block device (`activm run --disk`); a request blocks only its thread.
//!
//! Also [`upcall`] (scheduler activations, the upcall handler, a simulated VMM for tests),
//! [`config`] (time slice and such), [`stats`], and [`rt`] (low-level access for tests and
//! benchmarks).
#![no_std]

extern crate alloc;

mod activation;
mod alarm;
pub mod arch;
pub mod blk;
mod blk_async;
pub mod config;
mod diag;
mod dispatch;
mod exception_stack;
#[doc(hidden)]
pub mod fault;
pub mod io;
pub mod net;
pub mod net_any;
pub mod net_deadline;
pub(crate) mod percpu;
pub mod random;
pub mod rt;
pub(crate) mod sched;
pub mod stack;
#[doc(hidden)]
pub mod start;
pub mod stats;
pub mod sync;
pub(crate) mod tcb;
pub mod thread;
pub mod time;
pub(crate) mod timeline;
pub(crate) mod timer;
mod tls;
pub mod upcall;
mod watchdog;

pub use activm_stub::{print, println};

#[doc(hidden)]
pub use activm_stub as __stub;

/// Defines the guest's entry: `activm_rt::main!(main);` where `fn main(args: &[&str]) -> i32`.
/// `args` are the guest arguments (after `--` on the `activm run` line) minus the runtime's own
/// `--rt-*` ones ([`config`]).
#[macro_export]
macro_rules! main {
    ($main:path) => {
        fn __activm_rt_vcpu_entry(vcpu: u32) -> ! {
            let main: fn(&[&str]) -> i32 = $main;
            $crate::start::vcpu_entry(vcpu, main)
        }
        $crate::__stub::vcpu_entry!(__activm_rt_vcpu_entry);
    };
}
