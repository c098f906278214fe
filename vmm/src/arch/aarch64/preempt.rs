//! Testing only (`--preempt-at`, `crate::preempt_at`): not built for aarch64 yet. The way
//! x86_64 stops a vCPU at a CPL3 address (a breakpoint instruction there, a hardware breakpoint
//! on the guest's own exception entry, `arch/x86_64/preempt.rs`) would be a `brk` and the EL1
//! synchronous vector here; it is neither written nor tried, so the option is refused.

use kvm_ioctls::VcpuFd;

use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// The breakpoint instruction's first byte (unused: [`watch_breakpoint_gate`] refuses).
pub const BREAKPOINT: u8 = 0;

/// Where a breakpoint trap enters the guest (unused on aarch64).
pub fn breakpoint_gate(plan: &Plan) -> u64 {
    plan.vectors
}

/// Refused: `--preempt-at` is x86_64-only.
pub fn watch_breakpoint_gate(_fd: &VcpuFd, _gate: u64) -> Result<(), Error> {
    Err(Error::Config(
        "--preempt-at is implemented on x86_64 only".into(),
    ))
}

/// Never reached (no gate is watched).
pub fn unwind_breakpoint(_fd: &mut VcpuFd, _ram: &GuestRam, _gate: u64) -> Option<u64> {
    None
}
