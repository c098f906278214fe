//! The guest's net thread: it waits in `epoll_wait`, has the readiness handled (`poll.rs`),
//! publishes into the guest's `NetRing` and interrupts one idle vCPU; and the same publishing
//! after a net call on a vCPU thread. These reach the whole `Guest` (its outcome, its vCPUs),
//! which owns the `Net`.

use std::io;
use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvm_ioctls::IoEventAddress;
use vmm_sys_util::eventfd::EventFd;

use protocol::net::*;

use super::unseen::Unseen;
use super::{errno, poll, Net, Table};
use crate::guest::Guest;
use crate::vm::Outcome;

/// Publish what is queued for `guest`'s ring (`poll::publish`): how many; a guest that
/// corrupted its ring is ended.
fn publish(table: &mut Table, guest: &Guest) -> usize {
    poll::publish(table, &guest.ram).unwrap_or_else(|why| {
        guest.finish(Outcome::fault(0, why));
        0
    })
}

/// Publish what `close` queued (on a vCPU thread, after a net call).
pub fn after_call(guest: &Guest) {
    if !poll::pending() {
        return;
    }
    if let Some(net) = &guest.net {
        let posted = publish(&mut net.lock(), guest);
        if posted > 0 {
            fence(Ordering::SeqCst);
            crate::devices::blk_async::wake_one_idle(guest);
        }
    }
}

/// Start the guest's net thread (before the sandbox closes): it waits in `epoll_wait` and
/// posts readiness.
pub fn spawn_thread(guest: &Arc<Guest>) -> io::Result<()> {
    let Some(net) = &guest.net else {
        return Ok(());
    };
    let doorbell = doorbell(guest, net)?;
    let weak = Arc::downgrade(guest);
    std::thread::Builder::new()
        .name(format!("g{}-net", guest.id))
        .spawn(move || {
            crate::sandbox::enter(crate::sandbox::ThreadKind::Net);
            // Registered in the epoll instance while this thread lives.
            let _doorbell = doorbell;
            net_thread(&weak)
        })
        .map(|_| ())
}

/// The transmit doorbell (`protocol::net::net_doorbell_address`): an eventfd KVM signals when
/// the guest stores [`NET_DOORBELL_RING`] there, in the net thread's epoll with
/// [`poll::DOORBELL_EVENT`], edge-triggered (every store is an event; nothing reads the
/// counter). None when KVM refuses the ioeventfd: the store then exits, and the vCPU's thread
/// sends (`vcpu/exits.rs`).
fn doorbell(guest: &Guest, net: &Net) -> io::Result<Option<EventFd>> {
    let fd = EventFd::new(libc::EFD_NONBLOCK)?;
    let addr = net_doorbell_address(crate::arch::current::abi::HYPERCALL_BASE);
    if guest
        .vm
        .register_ioevent(&fd, &IoEventAddress::Mmio(addr), NET_DOORBELL_RING)
        .is_err()
    {
        return Ok(None);
    }
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLET) as u32,
        u64: poll::DOORBELL_EVENT,
    };
    // SAFETY: both descriptors are live; `ev` is a valid event.
    if unsafe {
        libc::epoll_ctl(
            net.epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            &mut ev,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(Some(fd))
}

/// How long the net thread keeps looking at the transmit rings after its last work before it
/// sleeps until the next readiness event (a reply comes this soon after its request was
/// reported, or a doorbell exit sends it).
const SENDER_POLL: Duration = Duration::from_micros(100);

/// While it polls, the net thread waits for readiness at most this long between two looks at
/// the transmit rings: a reply waits up to this long, but the thread sleeps in between instead
/// of spinning in `epoll_pwait` (on a shared host the spin took CPU the guest needed).
const SENDER_POLL_SLICE_NS: i64 = 20_000;

/// Stores `NetRing::sender` (the guest reads it after queueing bytes).
fn set_sender(guest: &Guest, table: &Table, polling: bool) {
    let Some(ring) = table.ring else { return };
    let ptr = (guest.ram.host_base() + ring + offset_of!(NetRing, sender) as u64) as *mut u32;
    // SAFETY: the ring lies in guest RAM (checked by `Net::setup`), mapped while the guest
    // lives; `sender` is an aligned `u32` the guest only reads, atomically.
    let word = unsafe { AtomicU32::from_ptr(ptr) };
    word.store(
        if polling { NET_SENDER_POLLING } else { 0 },
        Ordering::SeqCst,
    );
}

/// `epoll_pwait2` for at most `ns` (`epoll_pwait` counts in milliseconds).
fn wait_briefly(epoll: i32, events: &mut [libc::epoll_event; 64], ns: i64) -> i32 {
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: ns,
    };
    // SAFETY: `events` holds 64 entries, `timeout` is a valid timespec, no signal mask.
    unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait2,
            epoll,
            events.as_mut_ptr(),
            64,
            &timeout as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        ) as i32
    }
}

fn net_thread(weak: &Weak<Guest>) {
    let epoll = match weak
        .upgrade()
        .and_then(|g| g.net.as_ref().map(|n| n.epoll.as_raw_fd()))
    {
        // Kept open by `Net` while the guest lives; a dup would outlive it.
        Some(fd) => fd,
        None => return,
    };
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut polling = false;
    let mut last_work = Instant::now();
    let mut unseen = Unseen::default();
    loop {
        let due = unseen.due_in_ns();
        let n = if polling || due.is_some() {
            let slice = if polling {
                SENDER_POLL_SLICE_NS
            } else {
                i64::MAX
            };
            wait_briefly(epoll, &mut events, slice.min(due.unwrap_or(i64::MAX)))
        } else {
            // SAFETY: `events` holds 64 entries; a closed `epoll` makes this fail and the loop
            // end.
            unsafe { libc::epoll_pwait(epoll, events.as_mut_ptr(), 64, 200, std::ptr::null()) }
        };
        let Some(guest) = weak.upgrade() else { return };
        if guest.outcome().is_some() {
            return;
        }
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        let Some(net) = &guest.net else { return };
        let mut table = net.lock();
        // Data first: the threads its events wake run while this thread sends replies.
        let events = poll::handle_events(net, &guest.ram, &mut table, &events[..n as usize]);
        if events.is_ok() {
            let posted = publish(&mut table, &guest);
            if posted > 0 {
                drop(table);
                fence(Ordering::SeqCst);
                unseen.wake(&guest);
                table = net.lock();
            }
        }
        let mut work =
            events.and_then(|events| Ok(net.send_all_queued(&guest.ram, &mut table)? || events));
        if polling && !matches!(work, Ok(true)) && last_work.elapsed() > SENDER_POLL {
            // To sleep: say so, then look at every ring once more (a guest that queued bytes
            // before it saw the flag cleared is sent for here; after, it rings the doorbell).
            set_sender(&guest, &table, false);
            polling = false;
            fence(Ordering::SeqCst);
            work = net.send_all_queued(&guest.ram, &mut table);
        }
        let work = match work {
            Ok(work) => work,
            Err(why) => {
                drop(table);
                guest.finish(Outcome::fault(0, why));
                return;
            }
        };
        if work {
            last_work = Instant::now();
            if !polling {
                set_sender(&guest, &table, true);
                polling = true;
            }
        }
        // Tags of senders that waited for room.
        let posted = publish(&mut table, &guest);
        let consumed = table
            .ring
            .is_none_or(|ring| super::unseen::ring_tail(&guest, ring) == Some(table.head));
        drop(table);
        if posted > 0 {
            fence(Ordering::SeqCst);
            unseen.wake(&guest);
        } else {
            unseen.follow_up(&guest, consumed);
        }
    }
}
