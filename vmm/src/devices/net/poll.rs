//! The readiness side of guest sockets: one-shot epoll registrations, the guest's net thread,
//! and publishing `(tag, events)` into its `NetRing` (the block ring's protocol).

use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvm_ioctls::IoEventAddress;
use vmm_sys_util::eventfd::EventFd;

use protocol::net::*;
use protocol::shared::SharedHeader;

use super::linger::LINGER_EVENT;
use super::{errno, Net, Sock, Table};
use crate::allocator::Slot;
use crate::guest::Guest;
use crate::vm::Outcome;

/// The events `sock` should be registered for. A stream with a receive buffer stays
/// registered, edge-triggered: every arrival of data (or room, or the peer's close) queues one
/// event, and the net thread reads until a short read, so nothing needs re-arming per event.
/// Other sockets (listeners, connects in progress) are one-shot.
fn wanted_events(sock: &Sock) -> u32 {
    let mut events = libc::EPOLLRDHUP as u32;
    events |= if sock.rx.is_some() {
        libc::EPOLLET as u32
    } else {
        libc::EPOLLONESHOT as u32
    };
    if sock.read_tag.is_some() || sock.rx.as_ref().is_some_and(|rx| rx.wants_data()) {
        events |= libc::EPOLLIN as u32;
    }
    if sock.write_tag.is_some() || sock.tx.as_ref().is_some_and(|tx| tx.wants_room()) {
        events |= libc::EPOLLOUT as u32;
    }
    events
}

/// (Re-)register `sock` for what its tags and buffers wait for. A modification makes the
/// kernel look at the socket's readiness again, so a condition already true is reported.
pub(super) fn epoll_update(epoll: &OwnedFd, sock: &mut Sock, data: u64) -> Result<(), i32> {
    let Some(fd) = &sock.fd else {
        return Err(libc::ENOTCONN);
    };
    let events = wanted_events(sock);
    let mut ev = libc::epoll_event { events, u64: data };
    let op = if sock.in_epoll {
        libc::EPOLL_CTL_MOD
    } else {
        libc::EPOLL_CTL_ADD
    };
    // SAFETY: both descriptors are live; `ev` is a valid event.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) } < 0 {
        return Err(errno());
    }
    sock.in_epoll = true;
    sock.registered = events;
    Ok(())
}

/// After an event: one-shot registrations are re-armed; an edge-triggered one only when what
/// the socket waits for changed (a buffer filled up, the ring waits for room or stopped).
fn rearm_after_event(epoll: &OwnedFd, sock: &mut Sock, data: u64) {
    let events = wanted_events(sock);
    let waits = events & (libc::EPOLLIN | libc::EPOLLOUT) as u32 != 0;
    if events & libc::EPOLLET as u32 != 0 {
        if events != sock.registered {
            let _ = epoll_update(epoll, sock, data);
        }
    } else if waits {
        let _ = epoll_update(epoll, sock, data);
    }
}

/// Queue `(tag, events)` for the ring (the caller publishes with [`publish`]).
pub(super) fn post(table: &mut Table, tag: u32, events: u64) {
    table.waiting[tag as usize / 64] &= !(1u64 << (tag % 64));
    PENDING.with(|p| p.borrow_mut().push((tag, events)));
}

thread_local! {
    /// Completions taken under the table's lock, published before it is released.
    static PENDING: std::cell::RefCell<Vec<(u32, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Write the queued completions into the guest's ring (under the table's lock); how many.
fn publish(table: &mut Table, guest: &Guest) -> usize {
    let pending: Vec<(u32, u64)> = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let Some(ring) = table.ring else { return 0 };
    for &(tag, events) in &pending {
        let head = table.head;
        let tail = guest
            .ram
            .read_bytes(ring + offset_of!(NetRing, tail) as u64, 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let written = tail.map_err(|e| e.to_string()).and_then(|tail| {
            if head.wrapping_sub(tail) as usize >= NET_RING_CAPACITY {
                return Err(format!(
                    "the guest corrupted its net ring: no room (head {head}, tail {tail})"
                ));
            }
            let slot = head as usize % NET_RING_CAPACITY;
            let entry = ring
                + offset_of!(NetRing, entries) as u64
                + (slot * std::mem::size_of::<NetCompletion>()) as u64;
            guest
                .ram
                .write_struct(
                    entry,
                    &NetCompletion {
                        tag: u64::from(tag),
                        events,
                    },
                )
                .map_err(|e| e.to_string())?;
            fence(Ordering::Release);
            guest
                .ram
                .write_u32(
                    ring + offset_of!(NetRing, head) as u64,
                    head.wrapping_add(1),
                )
                .map_err(|e| e.to_string())
        });
        if let Err(why) = written {
            guest.finish(Outcome::fault(0, why));
            return 0;
        }
        table.head = head.wrapping_add(1);
    }
    pending.len()
}

/// Publish what `close` queued (on a vCPU thread, after a net call).
pub fn after_call(guest: &Guest) {
    if PENDING.with(|p| p.borrow().is_empty()) {
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

/// The epoll data of the transmit doorbell's eventfd (no socket index is `u32::MAX`, and a
/// lingering socket's key has bits 32-62 clear).
const DOORBELL_EVENT: u64 = u64::MAX;

/// The transmit doorbell (`protocol::net::net_doorbell_address`): an eventfd KVM signals when
/// the guest stores [`NET_DOORBELL_RING`] there, in the net thread's epoll, edge-triggered
/// (every store is an event; nothing reads the counter). None when KVM refuses the ioeventfd:
/// the store then exits, and the vCPU's thread sends (`vcpu/exits.rs`).
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
        u64: DOORBELL_EVENT,
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
        let events = handle_events(net, &guest, &mut table, &events[..n as usize]);
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
            events.and_then(|events| Ok(net.send_all_queued(&guest, &mut table)? || events));
        if polling && !matches!(work, Ok(true)) && last_work.elapsed() > SENDER_POLL {
            // To sleep: say so, then look at every ring once more (a guest that queued bytes
            // before it saw the flag cleared is sent for here; after, it rings the doorbell).
            set_sender(&guest, &table, false);
            polling = false;
            fence(Ordering::SeqCst);
            work = net.send_all_queued(&guest, &mut table);
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
            .is_none_or(|ring| ring_tail(&guest, ring) == Some(table.head));
        drop(table);
        if posted > 0 {
            fence(Ordering::SeqCst);
            unseen.wake(&guest);
        } else {
            unseen.follow_up(&guest, consumed);
        }
    }
}

/// How long reports may wait for a busy vCPU of the guest (running a thread, or spinning for
/// work) to take them at its next scheduler loop before a halted one is interrupted for them.
const BUSY_GRACE: Duration = Duration::from_micros(50);

/// Reports published while another vCPU of the guest was busy: no halted vCPU was interrupted
/// for them. A busy vCPU takes them when it next schedules (a socket reader runs ~1 us), or
/// finds them when it goes idle (it sets its idle bit, then looks at the ring); interrupting a
/// halted vCPU instead costs it an emulated interrupt entry, its run and its next halt (over
/// 100 us of host CPU here) for work the busy one does in microseconds. If they are still
/// there after [`BUSY_GRACE`] (the busy vCPU runs a long thread), a halted one is woken.
#[derive(Default)]
struct Unseen {
    since: Option<Instant>,
    /// When this thread last interrupted a halted vCPU (until the guest took the reports):
    /// that vCPU is on its way, and no second one is woken before [`WAKE_WAIT`].
    woke: Option<Instant>,
}

/// How long an interrupted halted vCPU may take to reach its scheduler loop (an interrupt to
/// a halted vCPU's CPL3 handler takes ~120 us on this host) before another one is woken.
const WAKE_WAIT: Duration = Duration::from_micros(250);

impl Unseen {
    /// Reports were published (and fenced): wake a halted vCPU unless another one is busy.
    fn wake(&mut self, guest: &Guest) {
        if !self.overdue() && some_vcpu_busy(guest) {
            self.since.get_or_insert_with(Instant::now);
            return;
        }
        self.interrupt(guest);
    }

    fn interrupt(&mut self, guest: &Guest) {
        self.since = None;
        if crate::devices::blk_async::wake_one_idle(guest) {
            self.woke = Some(Instant::now());
        }
    }

    /// Nothing new published: `consumed` says whether the guest took every report.
    fn follow_up(&mut self, guest: &Guest, consumed: bool) {
        if self.since.is_none() {
            return;
        }
        if consumed {
            self.since = None;
            self.woke = None;
        } else if self.overdue() || !some_vcpu_busy(guest) {
            self.interrupt(guest);
        }
    }

    /// When deferred reports are due for an interrupt.
    fn deadline(&self) -> Option<Instant> {
        let since = self.since?;
        let woke = self.woke.map_or(since, |w| w + WAKE_WAIT);
        Some((since + BUSY_GRACE).max(woke))
    }

    fn overdue(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// How long the net thread may sleep before [`Unseen::follow_up`] is due.
    fn due_in_ns(&self) -> Option<i64> {
        self.deadline().map(|d| {
            d.saturating_duration_since(Instant::now())
                .as_nanos()
                .clamp(1, i64::MAX as u128) as i64
        })
    }
}

/// Whether a vCPU of the guest holds a processor and is not marked idle (it schedules soon).
fn some_vcpu_busy(guest: &Guest) -> bool {
    let idle = guest
        .ram
        .read_u64(guest.plan.shared_area.start + offset_of!(SharedHeader, idle_vcpus) as u64)
        .unwrap_or(u64::MAX);
    let view = guest.procs.alloc.view(guest.id);
    view.vcpus
        .iter()
        .enumerate()
        .any(|(v, s)| v < 64 && idle & (1 << v) == 0 && matches!(s, Slot::Running(_)))
}

/// The guest's `NetRing::tail` (how far it took the reports).
fn ring_tail(guest: &Guest, ring: u64) -> Option<u32> {
    guest
        .ram
        .read_bytes(ring + offset_of!(NetRing, tail) as u64, 4)
        .ok()
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// Handles readiness events: fills receive buffers, sends what waited for room, posts the tags
/// that waited. Whether there were any; `Err` is a protocol violation.
fn handle_events(
    net: &Net,
    guest: &Guest,
    table: &mut Table,
    events: &[libc::epoll_event],
) -> Result<bool, String> {
    for ev in events {
        let (data, bits) = (ev.u64, u64::from(ev.events));
        if data == DOORBELL_EVENT {
            // The caller sends what every ring holds after the events.
            continue;
        }
        if data & LINGER_EVENT != 0 {
            net.linger_event(table, data);
            continue;
        }
        let s = (data & 0xffff_ffff) as usize;
        let Some(Some(sock)) = table.socks.get_mut(s) else {
            continue;
        };
        if sock.generation != (data >> 32) as u32 {
            continue;
        }
        let bad = NET_ERROR | NET_HANGUP;
        let mut ready = Vec::new();
        if let (Some(rx), Some(fd)) = (&mut sock.rx, &sock.fd) {
            if bits & (NET_READABLE | bad | libc::EPOLLRDHUP as u64) != 0 {
                let filled = rx.fill(guest, fd.as_raw_fd())?;
                ready.extend(filled.waiter.map(|t| (t, NET_READABLE)));
            }
        }
        if bits & (NET_READABLE | bad | libc::EPOLLRDHUP as u64) != 0 {
            ready.extend(sock.read_tag.take().map(|t| (t, bits & 0x1f)));
        }
        let room = bits & (NET_WRITABLE | bad) != 0;
        let resend = room && sock.tx.as_ref().is_some_and(|tx| tx.wants_room());
        if room {
            ready.extend(sock.write_tag.take().map(|t| (t, bits & 0x1f)));
        }
        rearm_after_event(&net.epoll, sock, data);
        for (tag, events) in ready {
            post(table, tag, events);
        }
        if resend {
            net.send_queued(guest, table, s)?;
        }
    }
    Ok(!events.is_empty())
}
