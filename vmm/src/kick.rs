//! What other threads may do to a vCPU (stop it, take its processor back) and the race-free
//! kick that gets it out of `KVM_RUN` for that.
//!
//! **Kick.** To get a vCPU out of `KVM_RUN`, the kicker sets a request flag, then sends the
//! thread [`kick_signal`]. The handler sets `kvm_run.immediate_exit`, so wherever the signal
//! lands (before `KVM_RUN`, inside it, or while the VMM handles an exit) the current or next
//! `KVM_RUN` returns `EINTR` and the loop sees the request. No kick is lost, none costs an ioctl.
//! Where a vCPU stands (running, being revoked, parked, blocked, stopped) is its allocator slot
//! ([`Slot`](crate::allocator::Slot)), the one state machine of a vCPU.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use kvm_bindings::kvm_run;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

/// What other threads may do to a vCPU: read its state, ask it to stop or to give its
/// processor back, kick it.
#[derive(Debug, Default)]
pub struct VcpuControl {
    pub(crate) stop_requested: AtomicBool,
    revoke_requested: AtomicBool,
    /// The upcall watchdog saw records left untaken on this running vCPU: look at its
    /// interrupt controller on the way out (`VcpuThread::redeliver_interrupts`).
    redelivery_requested: AtomicBool,
    /// The interrupt watch asks for a look at the vCPU's requested interrupts
    /// (`vcpu/nudge.rs`).
    interrupt_look_requested: AtomicBool,
    thread: OnceLock<libc::pthread_t>,
    /// Exits handled, by coarse reason (see `EXIT_*`).
    pub exits: [AtomicUsize; 3],
    /// The guest halted (`halt` hypercall) and has not run an instruction since as far as the
    /// VMM knows: KVM may still hold the vCPU halted.
    pub(crate) maybe_halted: AtomicBool,
    /// Upcall interrupts sent to this vCPU so far (the watchdog's second look, `redeliver.rs`).
    pub(crate) upcall_interrupts: AtomicU64,
    /// A timer that kicks this vCPU's thread, for other threads to arm: the thread of a running
    /// vCPU is the one that can act at once when a yielded vCPU's wake-up time comes
    /// ([`Allocator::yield_until`](crate::allocator::Allocator::yield_until)).
    wake_timer: OnceLock<KickTimer>,
    /// What the thread saw of its vCPU when the guest was stopped for a hang report.
    snapshot: Mutex<Option<crate::hang::state::VcpuSnapshot>>,
}

/// Indices into `VcpuControl::exits`.
pub const EXIT_HYPERCALL: usize = 0;
pub const EXIT_KICK: usize = 1;
pub const EXIT_OTHER: usize = 2;

impl VcpuControl {
    /// Register the calling thread as this vCPU's, with its `kvm_run` for the kick handler.
    pub(crate) fn bind(&self, run: *mut kvm_run) {
        KVM_RUN_PTR.with(|p| p.set(run));
        // SAFETY: pthread_self has no preconditions.
        let _ = self.thread.set(unsafe { libc::pthread_self() });
        if let Some(timer) = KickTimer::new() {
            let _ = self.wake_timer.set(timer);
        }
    }

    /// Kick this vCPU's thread at `at` (re-arming replaces an earlier time); a time a second or
    /// more away is not armed. Says whether it was armed.
    pub(crate) fn kick_at(&self, at: std::time::Instant) -> bool {
        // Rounded up: a timer that fires before `at` finds nothing due.
        let micros = at
            .saturating_duration_since(std::time::Instant::now())
            .as_nanos()
            .div_ceil(1000);
        match self.wake_timer.get() {
            Some(timer) if micros < 1_000_000 => {
                timer.arm((micros as i64).max(1));
                true
            }
            _ => false,
        }
    }

    /// Keep what the vCPU thread saw of its vCPU when the guest was stopped (`hang/`).
    pub(crate) fn set_snapshot(&self, snapshot: crate::hang::state::VcpuSnapshot) {
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
    }

    pub fn snapshot(&self) -> Option<crate::hang::state::VcpuSnapshot> {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The vCPU thread is done with its `kvm_run`.
    pub(crate) fn unbind(&self) {
        KVM_RUN_PTR.with(|p| p.set(null_mut()));
    }

    /// Whether a kick asked for this vCPU's processor (consumes the request).
    pub(crate) fn take_revoke_request(&self) -> bool {
        self.revoke_requested.swap(false, Ordering::AcqRel)
    }

    /// Whether a kick asked for a look at the vCPU's requested interrupts (consumes it).
    pub(crate) fn take_redelivery_request(&self) -> bool {
        self.redelivery_requested.swap(false, Ordering::AcqRel)
    }

    /// Whether the interrupt watch asked for a look at the requested interrupts (consumes it).
    pub(crate) fn take_interrupt_look_request(&self) -> bool {
        self.interrupt_look_requested.swap(false, Ordering::AcqRel)
    }

    /// The interrupt watch: kick this running vCPU to look for a requested interrupt KVM left
    /// undelivered (`vcpu/nudge.rs`).
    pub fn request_interrupt_look(&self) {
        self.interrupt_look_requested.store(true, Ordering::Release);
        self.kick();
    }

    /// Records wait untaken in this running vCPU's queue: kick it, and have it check on its
    /// way out that no requested interrupt is left undelivered.
    pub fn request_redelivery(&self) {
        self.redelivery_requested.store(true, Ordering::Release);
        self.kick();
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

    /// Host CPU time the vCPU's thread has used so far (`None` before it registered, or if
    /// the host cannot tell): whether the thread ran while its vCPU seemed stuck.
    pub fn thread_cpu_time(&self) -> Option<std::time::Duration> {
        let &thread = self.thread.get()?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `thread` is a live vCPU thread (as in `kick`); `clock` is a valid out-pointer.
        if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 {
            return None;
        }
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid out-pointer; `clock` names the thread's CPU clock.
        if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
            return None;
        }
        Some(std::time::Duration::new(
            now.tv_sec as u64,
            now.tv_nsec as u32,
        ))
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
pub fn install_kick_handler() -> Result<(), crate::error::Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), handle_kick).map_err(|e| {
            crate::error::Error::Host(format!("cannot install the vCPU kick handler: {e}"))
        });
    });
    result
}

/// A one-shot timer that kicks the thread that created it: used to run a vCPU forward a few
/// microseconds at a time until it is back at CPL3, and to wake a yielded vCPU on time.
#[derive(Debug)]
pub(crate) struct KickTimer(libc::timer_t);

// SAFETY: a `timer_t` is a process-wide timer id, not a pointer to thread-local state; the
// kernel serialises `timer_settime` calls on one timer from any thread, and the timer is
// deleted only on drop, when no other reference can exist.
unsafe impl Send for KickTimer {}
// SAFETY: as above: `arm` from several threads at once is a race on the expiry time only.
unsafe impl Sync for KickTimer {}

impl KickTimer {
    pub(crate) fn new() -> Option<KickTimer> {
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

    pub(crate) fn arm(&self, micros: i64) {
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
