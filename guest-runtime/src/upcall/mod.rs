//! Scheduler activations: turning them on, new activations, and the upcall handler.
//!
//! **Records.** The VMM puts records in a vCPU's queue (`protocol::shared`) and raises
//! `UPCALL_IRQ`. The handler ([`on_upcall`]) only preempts the interrupted thread (or, if it
//! may not, defers); the scheduler drains the queue at the top of its loop ([`drain`]), one
//! record at a time with a restartable sequence that copies the record and publishes the new
//! tail in one commit, in sequence order. Each kind:
//!
//! * NEWPROC: the activation running this code is new (its entry, [`__rt_activation_entry`],
//!   already took over the vCPU); counted and checked.
//! * PREEMPTED / UNBLOCKED (with a context): resumed here, see [`resume_context`].
//! * BLOCKED: the thread that ran on that activation is blocked in the VMM; it stays recorded
//!   under its activation id until its UNBLOCKED arrives.
//! * SIGNAL: the handler installed with [`set_signal_handler`] runs in a new thread (default:
//!   print and exit with 128 + signal).
//! * USER: `sa_preempt` from another vCPU: the interrupted thread was already preempted; the
//!   hook set with [`set_user_hook`] runs in the scheduler.
//!
//! **What a context is.** A record names the activation and the vCPU it ran on. That vCPU's
//! runtime words (`%gs` block: current thread, in-scheduler flag, idle flag, hold count,
//! scheduler stack) describe the context, and stay untouched while the VMM keeps the vCPU
//! parked. Whoever comes first takes them: the upcall handler processing the record (CAS of the
//! vCPU's activation word from the record's activation to 0), or the vCPU's next activation
//! (its entry swaps in its own id and files a snapshot under the old id for the record to find).
//!
//! **Critical-section recovery** (Williams 2002, section 6; Anderson et al. 1992, section 4.3). Before anything else a context
//! whose instruction pointer lies in a restartable sequence is rewound to its abort address, one inside the
//! stub trampoline before its EOI skips that EOI (it belongs to the other vCPU's APIC), and one
//! inside an activation entry is resolved by hand. Then:
//! * a thread context with preemption holds (a spinlock held) is **continued at once** on this
//!   vCPU, before anything else runs, with the hold count moved here and `PEND_CONT` set; its
//!   last release calls the safepoint, which switches it out and back to this scheduler;
//! * a thread context without holds becomes runnable on this vCPU;
//! * a scheduler context that was idling (nothing in flight) is dropped; one that was busy is
//!   **adopted**: this vCPU's scheduler gives up its own stack and continues the other one's,
//!   which only ever uses `%gs` afresh, so it simply goes on as this vCPU's scheduler.
//!
//! **Files.** `entry`: a new activation's Rust side (its first instructions are in `arch`);
//! `drain`: the upcall interrupt and the queue; `recover`: resuming contexts, continuing lock
//! holders, adopting schedulers; `signal`: SIGNAL and USER; `sim` (feature `sim`): a simulated
//! VMM for the in-guest tests. Below the scheduler, `crate::activation` holds the shared area
//! and the `sa_*` calls, the activation stack pools and the state table of ended activations.

use core::sync::atomic::Ordering;

use activm_stub::{println, IrqFrame};

use crate::activation::state;
use crate::arch::cpu::{self, Word};
use crate::percpu;

mod drain;
mod entry;
mod recover;
mod signal;
#[cfg(feature = "sim")]
pub mod sim;

pub use crate::activation::{cost, sa};

pub use crate::activation::enable;
pub use crate::activation::sa::{
    activations_enabled, backlog_cleared, backlog_waiting, granted_vcpus, init, init_vcpu,
    io_yield_supported, is_warm, preempt_vcpu, queue_nonempty, set_concurrency, set_idle,
    some_yielded, want_processors, yield_declined_lately, yield_idle_vcpu, yield_idle_vcpu_for_io,
    yield_wake_supported,
};
#[doc(hidden)]
pub use crate::activation::stacks::refill_pool_beside_a_producer;
pub use crate::activation::stacks::{register_boot_stack, release_act_stack, reserve_spare_stacks};
pub use crate::sched::in_unsafe_window;
pub use drain::{
    drain, on_upcall, print_waiting_records, records_waiting, BY_KIND, RECORDS, SEQ_ERRORS,
};
pub(crate) use recover::holder_waits_for_adoption;
pub use recover::loop_work;
pub(crate) use signal::set_dump;
pub use signal::{set_signal_handler, set_user_hook, LAST_SIGNAL};

/// The runtime's private vector for the simulated VMM (`sim`).
pub const VECTOR_SIM: u8 = crate::arch::cpu::SIM_IRQ;

/// Called first by the runtime's timer and simulated-VMM handlers (nothing without the
/// simulated VMM).
#[inline]
pub fn sim_on_interrupt(_frame: &IrqFrame) {
    #[cfg(feature = "sim")]
    sim::on_interrupt(_frame);
}

/// Statistics of the upcall path: (records, max sequence number, out-of-order records).
pub fn record_stats() -> (u64, u64, u64) {
    drain::record_stats()
}

/// Prints the shared area's view of every vCPU (diagnostics).
pub fn dump() {
    if !sa::mapped() {
        return;
    }
    for v in 0..percpu::nr_vcpus() {
        let a = sa::area(v);
        println!(
            "activm-rt: vCPU {v} shared area: state {} activation {} queue {}..{}",
            a.state.load(Ordering::Relaxed),
            a.activation.load(Ordering::Relaxed),
            a.queue_tail.load(Ordering::Relaxed),
            a.queue_head.load(Ordering::Relaxed),
        );
    }
    state::for_each_filed(|st| {
        println!(
            "activm-rt: filed state of activation {} (vCPU {}): current {:#x} hold {} in_sched {} idle {} stack {:#x}",
            st.activation, st.vcpu, st.current, st.hold, st.in_sched, st.sched_idle, st.sched_top
        )
    });
    println!(
        "activm-rt: continue {} later {} adopt {} enabled {}",
        recover::continuations_queued(),
        drain::records_waiting(),
        recover::adoptions_queued(),
        activations_enabled()
    );
    drain::print_waiting_records();
    recover::print_waiting_adoptions();
    for v in 0..percpu::nr_vcpus() {
        let p = percpu::of(v);
        println!(
            "activm-rt: vCPU {v}: in_drain {} sched_top {:#x}",
            p.in_drain.load(Ordering::Relaxed),
            cpu::get_of(v, Word::SchedTop)
        );
    }
}
