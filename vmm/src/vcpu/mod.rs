//! One host thread per vCPU: the run loop (`run.rs`), what each exit means (`exits.rs`, with the
//! hypercalls in `hypercalls.rs`) and what the vCPU does when it loses its processor
//! (`handoff.rs`). Other threads reach a vCPU through its [`VcpuControl`] (the kick); where it
//! stands is its allocator [`Slot`](crate::allocator::Slot).
//!
//! **Processors.** The thread runs guest code only while the allocator grants it a physical CPU
//! ([`Allocator::acquire`](crate::allocator::Allocator::acquire)). When the allocator revokes it:
//! an oblivious vCPU just waits to resume; a vCPU of a guest that takes upcalls is first run
//! forward to CPL3 with interrupts on (if it was in the stub's CPL0 code), its context is taken
//! and handed to the guest in a PREEMPTED record on another running vCPU, and the vCPU parks
//! until the allocator gives the guest a processor again, as a new activation (NEWPROC).

mod exits;
mod handoff;
pub(crate) mod hypercalls;
mod nudge;
mod redeliver;
mod run;

use std::sync::Arc;

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;

use crate::activation::NewActivation;
use crate::arch::current as arch;
use crate::devices::Blocking;
use crate::guest::Guest;
use crate::kick::KickTimer;
pub use crate::kick::{install_kick_handler, VcpuControl, EXIT_HYPERCALL, EXIT_KICK, EXIT_OTHER};
use crate::vm::Outcome;
pub use nudge::INTERRUPT_WATCH_PERIOD;

/// What the vCPU loop does after one `KVM_RUN` and the handling of its exit.
#[derive(Debug)]
pub enum ExitAction {
    /// Run on.
    Continue,
    /// `KVM_RUN` was interrupted by a kick: look at the requests.
    Kicked,
    /// The guest gave this vCPU's processor back (`sa_yield`), wanting one back `wake_ns`
    /// later if that is not 0.
    Yield { wake_ns: u64 },
    /// This vCPU is done (`vcpu_stop`); the guest goes on.
    Stop,
    /// The whole guest is done.
    Finish(Outcome),
    /// A device request that must wait longer than the disk's inline wait, or a file call
    /// that waits for the host: the vCPU blocks in the VMM (`handoff.rs`); the load's result
    /// is set when the request completes.
    Block(Blocking),
}

/// How many times a vCPU caught at CPL0 is run forward before it is descheduled without a
/// hand-off (the stub's CPL0 paths are ~20 instructions, a few microseconds each).
const MAX_RUN_FORWARD: u32 = 64;
/// Time the vCPU runs on between two looks while it is run forward.
const RUN_FORWARD_US: i64 = 20;
/// How long a new activation waits for the guest to put a stack into its empty pool.
const STACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a preemption is deferred when the guest sets `defer_preemption` (once per revoke).
const DEFER_GRACE_US: i64 = 100;

struct VcpuThread {
    fd: VcpuFd,
    index: u32,
    guest: Arc<Guest>,
    control: Arc<VcpuControl>,
    timer: Option<KickTimer>,
    /// The activation last started here, until the processor is next given back.
    fresh: Option<NewActivation>,
    /// Where the thread is now, for the hang report (`hang/`).
    place: &'static str,
    /// Parked by an `sa_yield` that asked for a processor back at this time.
    wake_at: Option<std::time::Instant>,
    /// The upcall watchdog's last look found KVM holding this vCPU halted (`redeliver.rs`).
    halted_seen: bool,
    /// A requested upcall vector waiting for its second look (`redeliver.rs`).
    relook: Option<redeliver::Relook>,
    /// Testing only: a `--preempt-at` point was reached; preempt now, without a deferral.
    preempt_here: bool,
}

/// Puts the calling vCPU thread at the host's idle priority (`SCHED_IDLE`): any thread of
/// normal priority woken on its CPU takes the CPU at once. A refusal is counted and ignored.
pub fn enter_host_idle_priority(guest: &Guest) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let done = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    let counter = if done {
        &guest.stats.idle_priority_threads
    } else {
        &guest.stats.idle_priority_refused
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The body of vCPU thread `index` of `guest`.
pub fn run_vcpu(mut fd: VcpuFd, index: u32, guest: Arc<Guest>) {
    let control = Arc::clone(&guest.vcpus[index as usize]);
    control.bind(fd.get_kvm_run() as *mut kvm_run);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let alloc = &guest.procs.alloc;
    alloc.register_thread(guest.id, index as usize, tid);
    arch::prepare_run(&mut fd);
    let mut vcpu = VcpuThread {
        fd,
        index,
        guest,
        control,
        timer: KickTimer::new(),
        fresh: None,
        place: "starting",
        wake_at: None,
        halted_seen: false,
        relook: None,
        preempt_here: false,
    };
    crate::sandbox::enter(crate::sandbox::ThreadKind::Vcpu);
    vcpu.run();
    if vcpu.guest.hang.wanted() {
        vcpu.control.set_snapshot(crate::hang::state::VcpuSnapshot {
            place: vcpu.place,
            halted: arch::halted(&vcpu.fd).ok(),
            registers: arch::dump(&vcpu.fd),
        });
    }
    vcpu.guest
        .procs
        .alloc
        .unregister_thread(vcpu.guest.id, index as usize);
    vcpu.control.unbind();
}
