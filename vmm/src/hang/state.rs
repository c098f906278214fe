//! What the hang report (`hang/mod.rs`) keeps while the guest runs: the state from before the
//! stop ([`HangState`], which the `Guest` holds) and what each vCPU thread saw on its way out
//! ([`VcpuSnapshot`], which its `VcpuControl` holds).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// [`VcpuSnapshot::place`] of a vCPU stopped while it ran guest code.
pub const RUNNING: &str = "running guest code";

/// What one vCPU thread saw of its vCPU when it stopped.
#[derive(Clone, Debug)]
pub struct VcpuSnapshot {
    /// Where the thread was: running guest code, waiting for a processor, ...
    pub place: &'static str,
    /// Whether KVM held the vCPU halted (`None`: could not tell).
    pub halted: Option<bool>,
    /// Registers and interrupt state (`arch::dump`).
    pub registers: String,
}

/// What the report keeps from before the guest was stopped.
#[derive(Debug, Default)]
pub struct HangState {
    pub(super) wanted: AtomicBool,
    pub(super) before: Mutex<Option<Before>>,
}

#[derive(Debug)]
pub(super) struct Before {
    pub(super) why: String,
    pub(super) slots: Vec<String>,
    pub(super) upcalls: Option<String>,
    /// Host CPU time each vCPU's thread used during `CPU_SAMPLE`, just before the stop.
    pub(super) ran: Vec<Option<Duration>>,
}

impl HangState {
    /// Whether the guest is being stopped for a report (vCPU threads then take snapshots).
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Acquire)
    }
}
