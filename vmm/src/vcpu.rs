//! One host thread per vCPU, an explicit state machine, and a race-free kick.
//!
//! **Kick.** To get a vCPU out of `KVM_RUN`, the kicker sets the vCPU's request flag, then sends
//! it [`kick_signal`]. The signal handler sets `kvm_run.immediate_exit`, so wherever the signal
//! lands (before `KVM_RUN`, inside it, or while the VMM handles an exit) the next or current
//! `KVM_RUN` returns `EINTR` and the loop sees the request. No window exists in which a kick is
//! lost, and a kick costs one signal, not an ioctl.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};

use kvm_bindings::kvm_run;
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::hypercall::{self, HcAction};
use crate::vm::{Outcome, VmShared};

/// The lifecycle of a vCPU thread. Transitions:
/// `Created → Running ⇄ HandlingExit`, `HandlingExit → Stopped` (the guest stopped this vCPU),
/// and any state → `Finished` when the thread ends.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuState {
    Created = 0,
    /// In (or about to enter) `KVM_RUN`.
    Running = 1,
    /// Out of `KVM_RUN`, handling an exit in the VMM.
    HandlingExit = 2,
    /// The guest stopped this vCPU (`vcpu_stop`).
    Stopped = 3,
    /// The thread has ended.
    Finished = 4,
}

impl VcpuState {
    fn from_raw(raw: u8) -> VcpuState {
        match raw {
            0 => VcpuState::Created,
            1 => VcpuState::Running,
            2 => VcpuState::HandlingExit,
            3 => VcpuState::Stopped,
            _ => VcpuState::Finished,
        }
    }
}

/// What other threads may do to a vCPU: read its state, ask it to stop, kick it.
#[derive(Debug, Default)]
pub struct VcpuControl {
    state: AtomicU8,
    stop_requested: AtomicBool,
    thread: OnceLock<libc::pthread_t>,
    /// Exits handled, by coarse reason, for `--stats` (hypercall, mmio, kick, other).
    pub exits: [AtomicUsize; 4],
}

/// Indices into `VcpuControl::exits`.
pub const EXIT_HYPERCALL: usize = 0;
pub const EXIT_KICK: usize = 1;
pub const EXIT_OTHER: usize = 2;

impl VcpuControl {
    pub fn state(&self) -> VcpuState {
        VcpuState::from_raw(self.state.load(Ordering::Acquire))
    }

    fn set_state(&self, state: VcpuState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// Ask the vCPU to leave its run loop, and kick it out of `KVM_RUN`.
    pub fn request_stop(&self) {
        self.stop_requested.store(true, Ordering::Release);
        self.kick();
    }

    /// Force the vCPU out of `KVM_RUN` soon (see the module comment).
    pub fn kick(&self) {
        if let Some(&thread) = self.thread.get() {
            // SAFETY: `thread` is the pthread of a vCPU thread that registered itself; it is
            // joined only after every kick (the VM joins vCPU threads last), so the id is live.
            unsafe {
                libc::pthread_kill(thread, kick_signal());
            }
        }
    }
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

thread_local! {
    /// This thread's `kvm_run`, for the kick signal handler.
    static KVM_RUN_PTR: Cell<*mut kvm_run> = const { Cell::new(null_mut()) };
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN_PTR.with(|p| p.get());
    if !run.is_null() {
        // SAFETY: the pointer is this thread's mapped `kvm_run`, set while the vCPU fd is alive
        // and cleared before it is dropped; a single byte store is async-signal-safe.
        unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 1) };
    }
    std::sync::atomic::fence(Ordering::Release);
}

/// Install the kick handler once per process.
pub fn install_kick_handler() -> Result<(), crate::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), handle_kick)
            .map_err(|e| crate::Error::Host(format!("cannot install the vCPU kick handler: {e}")));
    });
    result
}

/// A KVM exit, copied out of `kvm_run` so the vCPU fd is free again while it is handled.
#[derive(Debug)]
pub enum Exit {
    MmioRead { addr: u64, len: usize },
    MmioWrite { addr: u64, len: usize },
    Shutdown,
    InternalError { suberror: u32 },
    FailEntry { reason: u64 },
    Io { port: u16 },
    Other(String),
}

fn copy_exit(exit: VcpuExit<'_>) -> Exit {
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
        VcpuExit::InternalError => Exit::InternalError { suberror: 0 },
        VcpuExit::FailEntry(reason, _) => Exit::FailEntry { reason },
        VcpuExit::IoIn(port, _) | VcpuExit::IoOut(port, _) => Exit::Io { port },
        other => Exit::Other(format!("{other:?}")),
    }
}

/// The body of vCPU thread `index`.
pub fn run_vcpu(mut fd: VcpuFd, index: u32, vm: Arc<VmShared>) {
    let control = &vm.vcpus[index as usize];
    KVM_RUN_PTR.with(|p| p.set(fd.get_kvm_run() as *mut kvm_run));
    // SAFETY: pthread_self has no preconditions.
    let _ = control.thread.set(unsafe { libc::pthread_self() });
    fd.set_sync_valid_reg(SyncReg::Register);
    control.set_state(VcpuState::Running);

    while !control.stop_requested.load(Ordering::Acquire) {
        let exit = match fd.run() {
            Ok(exit) => copy_exit(exit),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                fd.set_kvm_immediate_exit(0);
                control.exits[EXIT_KICK].fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) => {
                vm.finish(Outcome::fault(index, format!("KVM_RUN failed: {e}")));
                break;
            }
        };
        control.set_state(VcpuState::HandlingExit);
        match handle_exit(&mut fd, index, &vm, exit) {
            HcAction::Continue => control.set_state(VcpuState::Running),
            HcAction::StopVcpu => {
                control.set_state(VcpuState::Stopped);
                vm.vcpu_stopped(index);
                break;
            }
            HcAction::Finish(outcome) => {
                vm.finish(outcome);
                break;
            }
        }
    }
    KVM_RUN_PTR.with(|p| p.set(null_mut()));
    if control.state() != VcpuState::Stopped {
        control.set_state(VcpuState::Finished);
    }
}

fn handle_exit(fd: &mut VcpuFd, index: u32, vm: &VmShared, exit: Exit) -> HcAction {
    let arch = crate::arch::current::vcpu::dump;
    match exit {
        Exit::MmioRead { addr, len } => {
            vm.vcpus[index as usize].exits[EXIT_HYPERCALL].fetch_add(1, Ordering::Relaxed);
            let regs = fd.sync_regs().regs;
            match hypercall::handle_load(fd, index, vm, addr, len, &regs) {
                Ok(value) => {
                    let bytes = value.to_le_bytes();
                    let run = fd.get_kvm_run();
                    // SAFETY: the last exit was KVM_EXIT_MMIO, so `mmio` is the active union
                    // field; `len` came from it and is at most 8.
                    unsafe { run.__bindgen_anon_1.mmio.data[..len].copy_from_slice(&bytes[..len]) };
                    HcAction::Continue
                }
                Err(action) => action,
            }
        }
        Exit::MmioWrite { addr, len } => {
            vm.vcpus[index as usize].exits[EXIT_OTHER].fetch_add(1, Ordering::Relaxed);
            HcAction::Finish(Outcome::fault(
                index,
                format!("{}\n{}", hypercall::describe_store(vm, addr, len), arch(fd)),
            ))
        }
        Exit::Shutdown => HcAction::Finish(Outcome::fault(
            index,
            format!(
                "guest triple fault (KVM shutdown) on vCPU {index}\n{}",
                arch(fd)
            ),
        )),
        Exit::InternalError { .. } => {
            let run = fd.get_kvm_run();
            // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, so `internal` is active.
            let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
            HcAction::Finish(Outcome::fault(
                index,
                format!(
                    "KVM internal error (suberror {suberror}) on vCPU {index}: the guest ran an \
                 instruction KVM could not emulate (at CPL0: no SSE or xgetbv there)\n{}",
                    arch(fd)
                ),
            ))
        }
        Exit::FailEntry { reason } => HcAction::Finish(Outcome::fault(
            index,
            format!(
                "KVM could not enter vCPU {index} (hardware reason {reason:#x})\n{}",
                arch(fd)
            ),
        )),
        Exit::Io { port } => HcAction::Finish(Outcome::fault(
            index,
            format!(
                "port I/O to {port:#x} on vCPU {index}: activm guests have no I/O ports\n{}",
                arch(fd)
            ),
        )),
        Exit::Other(what) => HcAction::Finish(Outcome::fault(
            index,
            format!("unexpected KVM exit {what} on vCPU {index}\n{}", arch(fd)),
        )),
    }
}
