//! What a vCPU exit means: a load from the hypercall page is a hypercall
//! (`hypercalls.rs`); every other exit ends the guest with a report.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvm_ioctls::VcpuExit;

use super::{ExitAction, VcpuThread};
use crate::arch::current as arch;
use crate::kick::{EXIT_HYPERCALL, EXIT_OTHER};
use crate::preempt_at::Trap;
use crate::vm::Outcome;

/// A KVM exit, copied out of `kvm_run` so the vCPU fd is free again while it is handled.
#[derive(Debug)]
pub enum Exit {
    MmioRead {
        addr: u64,
        len: usize,
    },
    MmioWrite {
        addr: u64,
        len: usize,
    },
    Shutdown,
    InternalError,
    FailEntry {
        reason: u64,
    },
    Io {
        port: u16,
    },
    /// A guest-debug exit: only the `--preempt-at` breakpoint gate is watched.
    Debug,
    Other(String),
}

impl Exit {
    pub(super) fn copy(exit: VcpuExit<'_>) -> Exit {
        match exit {
            VcpuExit::MmioRead(addr, data) => Exit::MmioRead {
                addr,
                len: data.len(),
            },
            VcpuExit::MmioWrite(addr, data) => Exit::MmioWrite {
                addr,
                len: data.len(),
            },
            VcpuExit::Shutdown => Exit::Shutdown,
            VcpuExit::InternalError => Exit::InternalError,
            VcpuExit::FailEntry(reason, _) => Exit::FailEntry { reason },
            VcpuExit::IoIn(port, _) | VcpuExit::IoOut(port, _) => Exit::Io { port },
            VcpuExit::Debug(_) => Exit::Debug,
            other => Exit::Other(format!("{other:?}")),
        }
    }
}

impl VcpuThread {
    /// The guest broke a rule: it ends with a report and the registers.
    pub(super) fn violation(&self, what: String) -> ExitAction {
        ExitAction::Finish(Outcome::fault(
            self.index,
            format!("{what}\n{}", arch::dump(&self.fd)),
        ))
    }

    /// Testing only: a vCPU trapped on a `--preempt-at` breakpoint (`preempt_at.rs`). It is
    /// put back on the point, which gets its original instruction back; then it is preempted
    /// there (the run loop hands it over as if its processor were revoked) or runs on.
    fn breakpoint_trap(&mut self) -> ExitAction {
        let guest = Arc::clone(&self.guest);
        let Some(hooks) = &guest.preempt_at else {
            return self.violation(format!("unexpected debug exit on vCPU {}", self.index));
        };
        let Some(addr) = arch::preempt::unwind_breakpoint(&mut self.fd, &guest.ram, hooks.gate())
        else {
            return self.violation(format!(
                "debug exit on vCPU {} that is not a CPL3 breakpoint trap",
                self.index
            ));
        };
        match hooks.on_trap(&guest.ram, addr) {
            Trap::NotOurs => self.violation(format!(
                "breakpoint trap at {addr:#x} on vCPU {}: not a --preempt-at point",
                self.index
            )),
            Trap::Pass => ExitAction::Continue,
            Trap::Preempt => {
                self.preempt_here = true;
                ExitAction::Kicked
            }
        }
    }

    /// Handle one exit.
    pub(super) fn handle_exit(&mut self, exit: Exit) -> ExitAction {
        let index = self.index;
        let count = |i: usize| self.control.exits[i].fetch_add(1, Ordering::Relaxed);
        match exit {
            Exit::MmioRead { addr, len } => {
                count(EXIT_HYPERCALL);
                self.hypercall(addr, len)
            }
            Exit::MmioWrite { addr, len } => {
                count(EXIT_OTHER);
                if addr == protocol::blk_submit::blk_doorbell_address(arch::abi::HYPERCALL_BASE) {
                    // The doorbell's store when KVM did not take it as an ioeventfd.
                    if let Some(disk) = &self.guest.disk {
                        disk.queue.ring_doorbell();
                        return ExitAction::Continue;
                    }
                }
                if addr == protocol::net::net_doorbell_address(arch::abi::HYPERCALL_BASE)
                    && len == 4
                {
                    // The transmit doorbell's store when KVM did not take it as an ioeventfd:
                    // this thread sends (`tx_flush_all`).
                    if let Some(net) = &self.guest.net {
                        let sent = net.ring_doorbell(&self.guest.ram);
                        crate::devices::net::thread::after_call(&self.guest);
                        if let Err(why) = sent {
                            return self.violation(why);
                        }
                        return ExitAction::Continue;
                    }
                }
                let what = if protocol::hypercall::decode(addr, arch::abi::HYPERCALL_BASE).is_some()
                {
                    format!(
                        "malformed hypercall: a {len}-byte store to the hypercall page at {addr:#x} (hypercalls are loads)"
                    )
                } else {
                    format!("{len}-byte store to unbacked guest-physical address {addr:#x}: no device there")
                };
                self.violation(what)
            }
            Exit::Shutdown => {
                self.violation(format!("guest triple fault (KVM shutdown) on vCPU {index}"))
            }
            Exit::InternalError => {
                let run = self.fd.get_kvm_run();
                // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, so `internal` is active.
                let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
                self.violation(format!(
                    "KVM internal error (suberror {suberror}) on vCPU {index}: the guest ran an \
                     instruction KVM could not emulate ({})",
                    arch::INTERNAL_ERROR_HINT
                ))
            }
            Exit::FailEntry { reason } => self.violation(format!(
                "KVM could not enter vCPU {index} (hardware reason {reason:#x})"
            )),
            Exit::Io { port } => self.violation(format!(
                "port I/O to {port:#x} on vCPU {index}: activm guests have no I/O ports"
            )),
            Exit::Debug => self.breakpoint_trap(),
            Exit::Other(what) => {
                self.violation(format!("unexpected KVM exit {what} on vCPU {index}"))
            }
        }
    }
}
