//! SIGNAL and USER records: host signals and `sa_preempt` from another vCPU.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use activm_stub::println;

/// Signals received (last number).
pub static LAST_SIGNAL: AtomicU64 = AtomicU64::new(0);

static SIGNAL_HANDLER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
static USER_HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
/// What prints the runtime's state before SIGQUIT exits (`stats::dump`, set once at start-up:
/// the dump reads the upcall queues this module is below).
static DUMP: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Sets what SIGQUIT prints the runtime's state with (start-up).
pub(crate) fn set_dump(dump: fn()) {
    DUMP.store(dump as *mut (), Ordering::Release);
}

/// Installs the handler for host signals (SIGNAL upcalls): it runs in a new thread named
/// "signal". Without one the guest prints the signal and exits with 128 + its number. SIGQUIT
/// never reaches it: the runtime prints its state and exits with 131.
pub fn set_signal_handler(handler: fn(u32)) {
    SIGNAL_HANDLER.store(handler as *mut (), Ordering::Release);
}

/// Installs a hook the scheduler calls (with the requesting vCPU) for USER upcalls.
pub fn set_user_hook(hook: fn(u32)) {
    USER_HOOK.store(hook as *mut (), Ordering::Release);
}

/// The host's SIGQUIT: the runtime prints its state, then exits, whatever handler is set.
const SIGQUIT: u64 = 3;

pub(super) fn signal(signo: u64) {
    LAST_SIGNAL.store(signo, Ordering::Release);
    if signo == SIGQUIT {
        println!("activm-rt: signal {signo} (SIGQUIT): the runtime's state, then exit");
        let dump = DUMP.load(Ordering::Acquire);
        if !dump.is_null() {
            // SAFETY: only `set_dump` stores non-null values, all `fn()`.
            let dump = unsafe { core::mem::transmute::<*mut (), fn()>(dump) };
            dump();
        }
        activm_stub::exit(128 + signo as i32);
    }
    let handler = SIGNAL_HANDLER.load(Ordering::Acquire);
    if handler.is_null() {
        println!("activm-rt: signal {signo}, exiting");
        activm_stub::exit(128 + signo as i32);
    }
    // SAFETY: only `set_signal_handler` stores non-null values, all `fn(u32)`.
    let handler = unsafe { core::mem::transmute::<*mut (), fn(u32)>(handler) };
    let _ = crate::thread::Builder::new()
        .name("signal".into())
        .spawn(move || handler(signo as u32));
}

/// A USER record: the hook, if one is set, runs here (in the scheduler).
pub(super) fn user(from_vcpu: u32) {
    let hook = USER_HOOK.load(Ordering::Acquire);
    if !hook.is_null() {
        // SAFETY: only `set_user_hook` stores non-null values, all `fn(u32)`.
        let hook = unsafe { core::mem::transmute::<*mut (), fn(u32)>(hook) };
        hook(from_vcpu);
    }
}
