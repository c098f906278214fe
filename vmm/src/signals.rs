//! Host signals: SIGINT, SIGTERM and SIGQUIT become SIGNAL upcalls; the second one stops every
//! guest. The runtime ends on SIGINT and SIGTERM quietly, and prints its state first on SIGQUIT
//! (Go's convention: SIGQUIT dumps the goroutines).

use std::sync::Arc;
use std::thread::JoinHandle;

use protocol::shared::UpcallKind;

use crate::activation::Event;
use crate::error::Error;
use crate::guest::Guest;
use crate::vm::Outcome;

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT];

/// Block SIGINT, SIGTERM and SIGQUIT in this thread and every thread it starts from now on, so only the
/// forwarder receives them. Call before starting any thread.
pub fn block() -> Result<libc::sigset_t, Error> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it; pthread_sigmask
    // changes only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in FORWARDED {
            libc::sigaddset(&mut set, signal);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(Error::Host("cannot block SIGINT/SIGTERM/SIGQUIT".into()));
        }
        Ok(set)
    }
}

/// Wait for the blocked signals in a thread of its own and forward them to the guests.
pub fn spawn_forwarder(set: libc::sigset_t, guests: Vec<Arc<Guest>>) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            crate::sandbox::enter(crate::sandbox::ThreadKind::Dispatcher);
            let mut count = 0;
            loop {
                let mut signal: libc::c_int = 0;
                // SAFETY: `set` is an initialised signal set; `signal` is a valid out pointer.
                if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                    return;
                }
                count += 1;
                eprintln!(
                    "activm: {} received{}",
                    match signal {
                        libc::SIGINT => "SIGINT",
                        libc::SIGQUIT => "SIGQUIT",
                        _ => "SIGTERM",
                    },
                    if count == 1 {
                        "; passing it to the guests (again to force exit)"
                    } else {
                        "; stopping every guest"
                    }
                );
                forward_signal(&guests, signal, count > 1);
            }
        })
        .ok()
}

/// Deliver a host signal to every guest: as a SIGNAL upcall where the guest takes upcalls,
/// otherwise by stopping it (it could not shut down cleanly anyway).
pub fn forward_signal(guests: &[Arc<Guest>], signal: i32, forced: bool) {
    let stopped = |guest: &Guest| forced || !guest.acts.enabled();
    // A guest that did not act on the first signal is usually stuck somewhere worth knowing
    // (`hang/`). Every report before any stop: a stopped guest frees its processors.
    for guest in guests.iter().filter(|g| stopped(g)) {
        guest.begin_hang_report(&format!("stopped by signal {signal}"));
    }
    for guest in guests {
        if stopped(guest) {
            guest.finish(Outcome::Signaled(signal));
        } else {
            guest.deliver(Event::new(UpcallKind::Signal, 0, 0, signal as u64));
        }
    }
}
