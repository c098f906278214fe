//! One host thread per vCPU: its state machine, a race-free kick, and what it does when it
//! gains or loses a physical CPU.
//!
//! **Kick.** To get a vCPU out of `KVM_RUN`, the kicker sets a request flag, then sends the
//! thread [`kick_signal`]. The handler sets `kvm_run.immediate_exit`, so wherever the signal
//! lands (before `KVM_RUN`, inside it, or while the VMM handles an exit) the current or next
//! `KVM_RUN` returns `EINTR` and the loop sees the request. No kick is lost, none costs an ioctl.
//!
//! **Processors.** The thread runs guest code only while the allocator grants it a physical CPU
//! ([`Allocator::acquire`](crate::allocator::Allocator::acquire)). When the allocator revokes it:
//! an oblivious vCPU just waits to resume; a vCPU of a guest that takes upcalls is first run
//! forward to CPL3 with interrupts on (if it was in the stub's CPL0 code), its context is taken
//! and handed to the guest in a PREEMPTED record on another running vCPU, and the vCPU parks
//! until the allocator gives the guest a processor again, as a new activation (NEWPROC).

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};

use kvm_bindings::kvm_run;
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};
use protocol::shared::{UpcallKind, VcpuRunState};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::activation::{Event, NewActivation, StartError};
use crate::allocator::{Acquired, Release};
use crate::arch::current::vcpu as arch;
use crate::devices::blk::Request;
use crate::guest::Guest;
use crate::hypercall::{self, HcAction};
use crate::vm::Outcome;

/// The lifecycle of a vCPU thread.
///
/// ```text
/// Created ─► WaitingForCpu ─► Running ⇄ HandlingExit ─► Blocked (device request) ─┐
///                 ▲               │                                                │
///                 ├── Preempting ◄┘ (revoked: context handed over, or descheduled)   │
///                 └─────────────────────────── (request done: UNBLOCKED, or resume) ◄┘
/// any ─► Stopped (the guest stopped this vCPU) / Finished (the thread ended)
/// ```
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuState {
    Created = 0,
    /// Waiting for the allocator to grant a physical CPU.
    WaitingForCpu = 1,
    /// In (or about to enter) `KVM_RUN`.
    Running = 2,
    /// Out of `KVM_RUN`, handling an exit in the VMM.
    HandlingExit = 3,
    /// Giving its processor back.
    Preempting = 4,
    /// The guest stopped this vCPU (`vcpu_stop`).
    Stopped = 5,
    /// The thread has ended.
    Finished = 6,
    /// Blocked in the VMM on a device request, holding no processor.
    Blocked = 7,
}

impl VcpuState {
    fn from_raw(raw: u8) -> VcpuState {
        match raw {
            0 => VcpuState::Created,
            1 => VcpuState::WaitingForCpu,
            2 => VcpuState::Running,
            3 => VcpuState::HandlingExit,
            4 => VcpuState::Preempting,
            5 => VcpuState::Stopped,
            7 => VcpuState::Blocked,
            _ => VcpuState::Finished,
        }
    }
}

/// What other threads may do to a vCPU: read its state, ask it to stop or to give its
/// processor back, kick it.
#[derive(Debug, Default)]
pub struct VcpuControl {
    state: AtomicU8,
    stop_requested: AtomicBool,
    revoke_requested: AtomicBool,
    thread: OnceLock<libc::pthread_t>,
    /// Exits handled, by coarse reason (see `EXIT_*`).
    pub exits: [AtomicUsize; 3],
    /// The guest halted (`halt` hypercall) and has not run an instruction since as far as the
    /// VMM knows: KVM may still hold the vCPU halted.
    pub(crate) maybe_halted: AtomicBool,
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

    /// Ask the vCPU to leave its run loop for good, and kick it.
    pub fn request_stop(&self) {
        self.stop_requested.store(true, Ordering::Release);
        self.kick();
    }

    /// The allocator wants this vCPU's processor back: flag it and kick it.
    pub fn revoke(&self) {
        self.revoke_requested.store(true, Ordering::Release);
        self.kick();
    }

    /// Force the vCPU out of `KVM_RUN` soon (see the module comment).
    pub fn kick(&self) {
        if let Some(&thread) = self.thread.get() {
            // SAFETY: `thread` is the pthread of a vCPU thread that registered itself; the
            // monitor joins vCPU threads only after the last kick can be sent (the guest is
            // finished and the dispatcher stopped), so the id is live.
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

/// A per-thread one-shot timer that kicks this thread: used to run a vCPU forward a few
/// microseconds at a time until it is back at CPL3.
struct KickTimer(libc::timer_t);

impl KickTimer {
    fn new() -> Option<KickTimer> {
        // SAFETY: sigevent is plain data, filled in before use; gettid has no preconditions.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = kick_signal();
        // SAFETY: as above.
        event.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = null_mut();
        // SAFETY: `event` and `timer` are valid for the call; the timer is deleted on drop.
        let ok = unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) } == 0;
        ok.then_some(KickTimer(timer))
    }

    fn arm(&self, micros: i64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: micros * 1000,
            },
        };
        // SAFETY: the timer exists (created in `new`); `spec` is valid for the call.
        unsafe { libc::timer_settime(self.0, 0, &spec, null_mut()) };
    }
}

impl Drop for KickTimer {
    fn drop(&mut self) {
        // SAFETY: the timer was created by timer_create and is deleted once.
        unsafe { libc::timer_delete(self.0) };
    }
}

/// A KVM exit, copied out of `kvm_run` so the vCPU fd is free again while it is handled.
#[derive(Debug)]
pub enum Exit {
    MmioRead { addr: u64, len: usize },
    MmioWrite { addr: u64, len: usize },
    Shutdown,
    InternalError,
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
        VcpuExit::InternalError => Exit::InternalError,
        VcpuExit::FailEntry(reason, _) => Exit::FailEntry { reason },
        VcpuExit::IoIn(port, _) | VcpuExit::IoOut(port, _) => Exit::Io { port },
        other => Exit::Other(format!("{other:?}")),
    }
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
    /// Whether this vCPU printed its registers for a stalled guest already.
    snapshot_taken: bool,
}

/// What one `KVM_RUN` led to.
enum Step {
    Continue,
    Kicked,
    Yield,
    Stop,
    Finish(Outcome),
    /// A device request that must wait.
    Block(Request),
}

/// The body of vCPU thread `index` of `guest`.
pub fn run_vcpu(mut fd: VcpuFd, index: u32, guest: Arc<Guest>) {
    KVM_RUN_PTR.with(|p| p.set(fd.get_kvm_run() as *mut kvm_run));
    fd.set_sync_valid_reg(SyncReg::Register);
    fd.set_sync_valid_reg(SyncReg::SystemRegister);
    let control = Arc::clone(&guest.vcpus[index as usize]);
    // SAFETY: pthread_self has no preconditions.
    let _ = control.thread.set(unsafe { libc::pthread_self() });
    let mut vcpu = VcpuThread {
        fd,
        index,
        guest,
        control,
        timer: KickTimer::new(),
        fresh: None,
        snapshot_taken: false,
    };
    crate::sandbox::enter(crate::sandbox::ThreadKind::Vcpu);
    vcpu.run();
    KVM_RUN_PTR.with(|p| p.set(null_mut()));
}

impl VcpuThread {
    fn trace_state(&self, name: &'static str, begin: bool) {
        if let Some(trace) = &self.guest.trace {
            if begin {
                trace.begin(self.guest.id, self.index, name);
            } else {
                trace.end(self.guest.id, self.index, name);
            }
        }
    }

    fn release(&self, why: Release) {
        let procs = &self.guest.procs;
        procs.revoke(procs.alloc.release(self.guest.id, self.index as usize, why));
    }

    fn run(&mut self) {
        loop {
            self.control.set_state(VcpuState::WaitingForCpu);
            match self
                .guest
                .procs
                .alloc
                .acquire(self.guest.id, self.index as usize)
            {
                Acquired::Exit => break,
                Acquired::Resume => {
                    if self.guest.acts.enabled() {
                        self.guest.flush_pending(self.index);
                    }
                }
                Acquired::NewActivation => match self.start_activation() {
                    Ok(true) => {}
                    Ok(false) => {
                        // Revoked while it waited for an upcall stack: nothing started, nothing
                        // to hand over; the processor goes back at once.
                        self.release(Release::Preempted);
                        continue;
                    }
                    Err(outcome) => {
                        self.guest.finish(outcome);
                        break;
                    }
                },
                Acquired::HandOff => {
                    // Waiting with a live context while the guest now takes upcalls: hand it
                    // over as if preempted now (running forward first if needed).
                    self.give_back_processor();
                    continue;
                }
            }
            self.control.set_state(VcpuState::Running);
            self.trace_state("running", true);
            let step = self.run_until_revoked();
            self.trace_state("running", false);
            match step {
                Step::Kicked => self.give_back_processor(),
                Step::Yield => self.yielded(),
                Step::Stop => {
                    self.control.set_state(VcpuState::Stopped);
                    self.release(Release::Stopped);
                    self.guest.vcpu_stopped();
                    break;
                }
                Step::Finish(outcome) => {
                    self.guest.finish(outcome);
                    break;
                }
                Step::Block(req) => self.block_on_request(req),
                Step::Continue => unreachable!("run_until_revoked returns only on a change"),
            }
        }
        if self.control.state() != VcpuState::Stopped {
            self.control.set_state(VcpuState::Finished);
        }
    }

    /// Whether a kick asked for this vCPU's processor and the allocator still wants it back
    /// (consumes the request).
    fn take_revoke(&self) -> bool {
        self.control.revoke_requested.swap(false, Ordering::AcqRel)
            && self
                .guest
                .procs
                .alloc
                .revoking(self.guest.id, self.index as usize)
    }

    /// Run guest code until the processor is revoked or the vCPU/guest is done.
    fn run_until_revoked(&mut self) -> Step {
        loop {
            if self.control.stop_requested.load(Ordering::Acquire) {
                return Step::Finish(self.guest.outcome().unwrap_or(Outcome::AllStopped));
            }
            if self.take_revoke() {
                return Step::Kicked;
            }
            match self.step() {
                Step::Continue | Step::Kicked => {}
                other => return other,
            }
        }
    }

    /// One `KVM_RUN` and the handling of its exit.
    fn step(&mut self) -> Step {
        let exit = match self.fd.run() {
            Ok(exit) => {
                // It exited on an instruction, so it is not halted.
                self.control.maybe_halted.store(false, Ordering::Relaxed);
                copy_exit(exit)
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.fd.set_kvm_immediate_exit(0);
                if self.guest.stall_snapshot.load(Ordering::Acquire) && !self.snapshot_taken {
                    self.snapshot_taken = true;
                    eprintln!(
                        "activm: vCPU {} of the stalled guest, in KVM_RUN:\n{}",
                        self.index,
                        arch::dump(&self.fd)
                    );
                }
                self.control.exits[EXIT_KICK].fetch_add(1, Ordering::Relaxed);
                return Step::Kicked;
            }
            Err(e) => {
                return Step::Finish(Outcome::fault(self.index, format!("KVM_RUN failed: {e}")))
            }
        };
        self.control.set_state(VcpuState::HandlingExit);
        let step = match hypercall::handle_exit(&mut self.fd, self.index, &self.guest, exit) {
            HcAction::Continue => Step::Continue,
            HcAction::Yield => Step::Yield,
            HcAction::StopVcpu => Step::Stop,
            HcAction::Finish(outcome) => Step::Finish(outcome),
            HcAction::Block(req) => Step::Block(req),
        };
        self.control.set_state(VcpuState::Running);
        step
    }

    /// Let KVM finish an MMIO load the VMM answered (write the result register, advance the
    /// instruction pointer) without running guest code, so the registers are final.
    fn complete_pending_io(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        let _ = self.fd.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    /// The allocator took the processor: hand the context to the guest or just wait.
    fn give_back_processor(&mut self) {
        self.control.set_state(VcpuState::Preempting);
        let kicked_at = crate::rdtsc();
        self.complete_pending_io();
        if !self.guest.acts.enabled() {
            self.guest.stats.deschedules.fetch_add(1, Ordering::Relaxed);
            self.release(Release::Descheduled);
            return;
        }
        // Revoked before the new activation ran a single instruction: there is no context to
        // hand over, and its NEWPROC must not reach another vCPU. Cancel it.
        if let Some(fresh) = self.fresh.take() {
            let regs = self.fd.sync_regs().regs;
            if regs.rip == fresh.entry && regs.rsp == fresh.stack_top - 8 {
                self.guest.acts.cancel_activation(
                    &self.guest.ram,
                    &self.guest.plan,
                    self.index,
                    fresh,
                );
                self.guest.stats.canceled.fetch_add(1, Ordering::Relaxed);
                self.release(Release::Preempted);
                return;
            }
        }
        // The guest asked for a short reprieve (it holds a lock): grant it once, bounded, and
        // tell it to yield when it can (`preempt_pending`).
        let (ram, plan) = (&self.guest.ram, &self.guest.plan);
        if self.guest.acts.defer_requested(ram, plan, self.index) && self.timer.is_some() {
            self.guest
                .acts
                .set_preempt_pending(ram, plan, self.index, true);
            self.guest.stats.deferrals.fetch_add(1, Ordering::Relaxed);
            if let Some(timer) = &self.timer {
                timer.arm(DEFER_GRACE_US);
            }
            loop {
                match self.step() {
                    Step::Continue => {}
                    Step::Kicked => break,
                    Step::Finish(outcome) => return self.guest.finish(outcome),
                    Step::Block(req) => {
                        // It blocks: that frees the processor too.
                        self.guest.acts.set_preempt_pending(
                            &self.guest.ram,
                            &self.guest.plan,
                            self.index,
                            false,
                        );
                        return self.block_on_request(req);
                    }
                    Step::Stop | Step::Yield => {
                        // It gave the processor up itself: nothing to hand over.
                        self.guest.acts.set_preempt_pending(
                            &self.guest.ram,
                            &self.guest.plan,
                            self.index,
                            false,
                        );
                        return self.yielded();
                    }
                }
            }
            self.complete_pending_io();
            self.guest.acts.set_preempt_pending(
                &self.guest.ram,
                &self.guest.plan,
                self.index,
                false,
            );
        }
        // Run forward until the vCPU is at CPL3 with interrupts on.
        let mut forward = 0;
        while !arch::at_user_level(&self.fd) {
            if forward == 0 {
                self.guest
                    .stats
                    .run_forwards
                    .fetch_add(1, Ordering::Relaxed);
            }
            forward += 1;
            if forward > MAX_RUN_FORWARD || self.timer.is_none() {
                // Could not catch it at user level: deschedule it; it resumes where it was.
                self.guest.stats.deschedules.fetch_add(1, Ordering::Relaxed);
                self.release(Release::Descheduled);
                return;
            }
            if let Some(timer) = &self.timer {
                timer.arm(RUN_FORWARD_US);
            }
            match self.step() {
                Step::Continue | Step::Kicked => {}
                Step::Finish(outcome) => return self.guest.finish(outcome),
                Step::Block(req) => return self.block_on_request(req),
                Step::Stop | Step::Yield => {
                    // The guest gave the processor up itself meanwhile: nothing to hand over.
                    return self.yielded();
                }
            }
            self.complete_pending_io();
        }
        let Some(context) = self.take_context("preempted") else {
            return;
        };
        let activation = self.guest.acts.current(self.index);
        self.guest.acts.end_activation(
            &self.guest.ram,
            &self.guest.plan,
            self.index,
            VcpuRunState::Preempted,
        );
        let mut event = Event::new(UpcallKind::Preempted, activation, self.index, 0);
        event.context = Some(Box::new(context));
        event.tsc = kicked_at;
        self.guest.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.guest
            .stats
            .preempt_delays
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(crate::rdtsc().saturating_sub(kicked_at));
        // Give the processor back first, so the record goes to a vCPU that keeps running.
        self.release(Release::Preempted);
        self.guest.deliver(event);
    }

    /// A device request must wait: give the processor back, do the I/O on this thread, then
    /// hand the context over (UNBLOCKED) or wait to resume where the vCPU was.
    ///
    /// With activations (and the request made at CPL3, as the runtime does): the activation
    /// ends, the processor goes to a new activation if the guest has a parked vCPU and wants it,
    /// and a BLOCKED record names the ended activation. When the request completes its result is
    /// put in the thread's result register and that context travels in an UNBLOCKED record,
    /// while this vCPU parks; if the guest is owed a processor, this vCPU starts that new
    /// activation itself with the UNBLOCKED in its own queue. Otherwise the UNBLOCKED goes to a
    /// running vCPU (into the queue that got the BLOCKED, if it still lives, so it cannot
    /// overtake it). Oblivious guests' vCPUs just lose their processor meanwhile.
    fn block_on_request(&mut self, req: Request) {
        let Some(disk) = &self.guest.disk else {
            unreachable!("only device requests block")
        };
        self.control.set_state(VcpuState::Blocked);
        self.trace_state("blocked", true);
        let handing_over = self.guest.acts.enabled() && arch::at_user_level(&self.fd);
        let (ram, plan) = (&self.guest.ram, &self.guest.plan);
        let activation = self.guest.acts.current(self.index);
        if handing_over {
            self.fresh = None;
            self.guest
                .acts
                .end_activation(ram, plan, self.index, VcpuRunState::Blocked);
        }
        self.release(Release::Blocked);
        if handing_over {
            // No interrupt for it: it goes out with the NEWPROC of the activation that takes
            // the processor, or ahead of the UNBLOCKED, or with the next quantum's retry.
            self.guest
                .post_pending(Event::new(UpcallKind::Blocked, activation, self.index, 0));
        }
        let result = disk.perform(ram, &req, &self.control.stop_requested);
        self.trace_state("blocked", false);
        hypercall::set_load_result(&mut self.fd, result);
        if self.control.stop_requested.load(Ordering::Acquire) {
            return;
        }
        if !handing_over {
            let procs = &self.guest.procs;
            let (kicks, _) = procs
                .alloc
                .unblock(self.guest.id, self.index as usize, false);
            procs.revoke(kicks);
            return;
        }
        self.complete_pending_io();
        let Some(context) = self.take_context("unblocked") else {
            return;
        };
        let mut event = Event::new(UpcallKind::Unblocked, activation, self.index, result);
        event.context = Some(Box::new(context));
        let procs = &self.guest.procs;
        let (kicks, restarts_here) = procs
            .alloc
            .unblock(self.guest.id, self.index as usize, true);
        procs.revoke(kicks);
        if restarts_here {
            // This vCPU starts the new activation the guest is owed next (the run loop picks
            // up the grant): the record rides in its own queue, after its NEWPROC, and no
            // other vCPU has to be interrupted.
            self.guest.post_pending(event);
        } else {
            self.guest.deliver(event);
        }
    }

    /// The vCPU's user context (sync regs and one FPU transfer), to hand to the guest; if KVM
    /// refuses it the guest is stopped and `None` returned.
    fn take_context(&self, what: &str) -> Option<crate::arch::current::abi::UserContext> {
        match arch::capture_user_context(&self.fd) {
            Ok(context) => Some(context),
            Err(e) => {
                self.guest.finish(Outcome::fault(
                    self.index,
                    format!("cannot take the {what} context: {e}"),
                ));
                None
            }
        }
    }

    /// The guest gave the processor up itself (`sa_yield`), possibly while the VMM was taking
    /// it: nothing to hand over; the vCPU parks until a new activation.
    fn yielded(&mut self) {
        self.guest.stats.yields.fetch_add(1, Ordering::Relaxed);
        self.complete_pending_io();
        self.fresh = None;
        self.guest
            .acts
            .yield_activation(&self.guest.ram, &self.guest.plan, self.index);
        self.release(Release::Yielded);
        // Records that reached its queue after the guest decided to yield were taken back:
        // they go to a running vCPU, or make the guest want a processor to receive them.
        if self.guest.acts.pending() > 0 {
            match self.guest.running_vcpu(None) {
                Some(vcpu) => self.guest.flush_pending(vcpu),
                None => {
                    let procs = &self.guest.procs;
                    procs.revoke(procs.alloc.want_one(self.guest.id));
                }
            }
        }
    }

    /// Start a new activation here: NEWPROC (and pending events) in this vCPU's queue, then
    /// enter the guest's upcall entry on a stack from its pool.
    /// `Ok(false)`: the processor was revoked while the activation waited for a stack.
    fn start_activation(&mut self) -> Result<bool, Outcome> {
        // An empty stack pool is a guest that has not recycled its upcall stacks yet: wait for
        // it (its other vCPUs run), up to a bound; a pool that stays empty is a guest bug.
        let waiting_since = std::time::Instant::now();
        let start = loop {
            match self.guest.acts.start_activation(&self.guest.ram, &self.guest.plan, self.index) {
                Ok(start) => break start,
                Err(StartError::NoStack) if waiting_since.elapsed() < STACK_WAIT => {
                    if self.control.stop_requested.load(Ordering::Acquire) {
                        return Err(self.guest.outcome().unwrap_or(Outcome::AllStopped));
                    }
                    if self.take_revoke() {
                        return Ok(false);
                    }
                    self.guest.stats.stack_waits.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                Err(StartError::NoStack) => {
                    return Err(Outcome::fault(
                        self.index,
                        format!(
                            "a new activation has waited {STACK_WAIT:?} for an upcall stack: the guest's stack pool stays empty"
                        ),
                    ))
                }
                Err(StartError::Fatal(why)) => return Err(Outcome::fault(self.index, why)),
            }
        };
        // A vCPU taken away while halted is still halted in KVM: the new activation would not
        // run until some interrupt came.
        if self.control.maybe_halted.swap(false, Ordering::Relaxed) {
            if let Err(e) = self.fd.set_mp_state(kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            }) {
                return Err(Outcome::fault(
                    self.index,
                    format!("KVM_SET_MP_STATE(RUNNABLE) for a new activation: {e}"),
                ));
            }
        }
        // A zero return address above the entry's stack frame.
        let _ = self.guest.ram.write_u64(start.stack_top - 8, 0);
        arch::enter_activation(
            &mut self.fd,
            start.entry,
            start.stack_top,
            self.index,
            start.activation,
        );
        self.fresh = Some(start);
        self.guest.stats.upcalls[UpcallKind::NewProc as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &self.guest.trace {
            trace.instant(
                self.guest.id,
                self.index,
                "upcall NEWPROC",
                start.activation as u64,
            );
        }
        Ok(true)
    }
}
