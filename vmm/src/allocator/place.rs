//! Where granted vCPUs run on the host: processor `p` of the budget is one host CPU (the
//! `p`-th, modulo their number, of the CPUs the process may run on), and a vCPU thread granted
//! processor `p` is bound to that CPU before it is woken.
//!
//! Why: left to itself, Linux wakes a granted vCPU thread on the CPU it last ran on or on the
//! waker's, which is often one where another vCPU thread still runs guest code (the one whose
//! processor was just taken has not parked yet, or the other guest's). The woken thread then
//! waits there for that thread's slice to end at a host tick (4 ms at HZ=250) while the CPU the
//! allocator meant for it idles: that was the ~2 ms of most vCPU adds through `activm ctl`
//! (seen in a scheduler trace; docs/activations.md, "Against the host scheduler"). Bound to its
//! processor's CPU, the thread runs where the allocator freed a processor.
//!
//! On by default (`MonitorOptions::place_vcpus`; `--no-place-vcpus` turns it off), only when the
//! budget covers every CPU the process may use (the default, or a `taskset` as wide as
//! `--pcpus`); never for host-scheduled runs (`--host-sched`), which are the baseline.
//! A thread is re-bound only when its processor changes (one `sched_setaffinity`: ~1.3 us of
//! CPU time on a sleeping thread here); a vCPU that gets its own processor back costs nothing.
//!
//! **A guest alone shares its processors among its threads.** Once a granted thread started
//! on its CPU, and while no other guest holds or wants a processor, the guest's running threads
//! may each run on the CPUs of all the processors the guest holds
//! ([`share_cpus_in_lone_guests`]): a host process beside the guest (the client of a server in
//! it) then shares a CPU with the guest's idle vCPU rather than its busy one. Bound one to one,
//! std-kv's busy vCPU shared its CPU with `redis-benchmark` while the guest's other CPU idled,
//! and it served 0.7-0.8x the requests of the same threads left to Linux. When another guest is
//! granted a processor, the threads are bound to their own processors' CPUs again
//! ([`narrow_guest_sets`]).
//!
//! **Beside guests at the host's idle priority** (`SCHED_IDLE`, [`Placement::set_idle`]: the
//! best-effort guests beside a latency-critical one), a guest of normal priority that is the
//! only one holds the CPUs of every processor: a thread of its own preempts an idle-priority
//! vCPU thread at once, so its busy vCPU runs wherever the host has a CPU to spare (one bound
//! to its processor's CPU waited there behind the server's own client while the batch guest's
//! CPU was free to take).
//!
//! **Widened under foreign load.** A CPU that other processes keep busy holds a thread bound to
//! it: the granted thread waits there for a host tick or more (54 ms was seen) while the other
//! CPU may be free, and the chaos soak got fewer preemptions with placement than without it on
//! a loaded host. So a granted thread that has not started [`SLOW_START`] after its grant (seen
//! when it starts, or by the quantum's look at the grants still waiting) widens placement:
//! every vCPU thread may then run on any CPU of the process, for [`WIDE_FOR`] after the last
//! slow start; then each thread is bound to its processor again at its next grant.

use std::time::{Duration, Instant};

use super::{GuestId, Slot, State};

/// A granted vCPU thread not running this long after its grant waits behind another thread on
/// its CPU: a wake-up onto a free CPU takes 7-50 us here, while a busy CPU's thread keeps it
/// until its slice ends at a host tick (every 4 ms).
pub(super) const SLOW_START: Duration = Duration::from_millis(2);
/// How long placement stays widened after the last slow start.
pub(super) const WIDE_FOR: Duration = Duration::from_millis(250);

/// One vCPU's thread, as placement knows it.
#[derive(Clone, Copy, Debug, Default)]
struct Thread {
    /// Its id; 0 until it registers.
    tid: libc::pid_t,
    /// The processor it is bound to (or was, while widened).
    processor: Option<usize>,
    /// Allowed on every CPU of the process (placement widened), not only its processor's.
    wide: bool,
    /// Granted a processor at this instant (its thread registered) and not running yet.
    granted_at: Option<Instant>,
    /// The processors (bits) whose CPUs it may run on, when bound to its guest's set (0: bound
    /// to its own processor's CPU, or not bound).
    set: u64,
}

/// The host CPUs behind the processors, and the threads bound to them.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// Host CPUs this process may run on, in order; empty: placement is off.
    cpus: Vec<usize>,
    /// Per guest, per vCPU.
    threads: Vec<Vec<Thread>>,
    /// Threads re-bound to their processor so far (`sched_setaffinity` calls), for `--stats`.
    pub(super) rebinds: u64,
    /// Placement is widened until then (see the module comment).
    wide_until: Option<Instant>,
    /// Times placement was widened, for `--stats`.
    pub(super) widenings: u64,
    /// Per guest: its vCPU threads run at the host's idle priority.
    idle: Vec<bool>,
}

impl Placement {
    /// Turn placement on over the CPUs this process may run on now, if the budget covers them
    /// all: a smaller budget must not crowd every activm process onto the same first CPUs (the
    /// user confines activm with `taskset` to get both). Says whether it is on.
    pub(super) fn enable(&mut self, budget: usize) -> bool {
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid cpu_set_t of the size given, for the kernel to fill.
        let ok =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
                == 0;
        if !ok {
            return false;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET reads the set in bounds (i < CPU_SETSIZE).
            .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
            .collect();
        if cpus.is_empty() || budget < cpus.len() {
            return false;
        }
        self.cpus = cpus;
        true
    }

    pub(super) fn add_guest(&mut self, nr_vcpus: usize) {
        self.threads.push(vec![Thread::default(); nr_vcpus]);
        self.idle.push(false);
    }

    /// `guest`'s vCPU threads run at the host's idle priority (see the module).
    pub(super) fn set_idle(&mut self, guest: GuestId, on: bool) {
        if let Some(idle) = self.idle.get_mut(guest) {
            *idle = on;
        }
    }

    /// The thread of `vcpu` of `guest` is `tid` (the calling thread); it binds itself as a
    /// thread granted before it registered would have been.
    pub(super) fn register(&mut self, guest: GuestId, vcpu: usize, tid: libc::pid_t) {
        let Some(entry) = self.threads.get_mut(guest).and_then(|g| g.get_mut(vcpu)) else {
            return;
        };
        entry.tid = tid;
        let thread = *entry;
        if thread.wide {
            self.bind_wide(0);
        } else if thread.set != 0 {
            self.bind_set(0, thread.set);
        } else if let Some(processor) = thread.processor {
            self.bind(0, processor);
        }
    }

    /// The thread of `vcpu` of `guest` ends: never touch its id again (it may be reused).
    pub(super) fn unregister(&mut self, guest: GuestId, vcpu: usize) {
        if let Some(entry) = self.threads.get_mut(guest).and_then(|g| g.get_mut(vcpu)) {
            entry.tid = 0;
        }
    }

    /// Whether placement is widened at `now`.
    fn widened(&self, now: Instant) -> bool {
        self.wide_until.is_some_and(|until| now < until)
    }

    /// A granted thread started slowly at `now`: every thread may run on any CPU of the
    /// process until [`WIDE_FOR`] from now.
    fn widen(&mut self, now: Instant) {
        if !self.widened(now) {
            self.widenings += 1;
        }
        self.wide_until = Some(now + WIDE_FOR);
        for g in 0..self.threads.len() {
            for v in 0..self.threads[g].len() {
                let thread = &mut self.threads[g][v];
                if thread.wide {
                    continue;
                }
                thread.wide = true;
                thread.set = 0;
                let tid = thread.tid;
                if tid != 0 {
                    self.bind_wide(tid);
                }
            }
        }
    }

    /// The thread of `vcpu` of `guest` picked up its grant at `now`.
    pub(super) fn started(&mut self, guest: GuestId, vcpu: usize, now: Instant) {
        let Some(entry) = self.threads.get_mut(guest).and_then(|g| g.get_mut(vcpu)) else {
            return;
        };
        let slow = entry
            .granted_at
            .take()
            .is_some_and(|at| now.saturating_duration_since(at) > SLOW_START);
        if slow && !self.cpus.is_empty() {
            self.widen(now);
        }
    }

    fn bind(&mut self, tid: libc::pid_t, processor: usize) {
        self.set_affinity(tid, &[self.cpus[processor % self.cpus.len()]]);
        self.rebinds += 1;
    }

    /// Binds `tid` to the CPUs of the processors in `set` (bits).
    fn bind_set(&mut self, tid: libc::pid_t, set: u64) {
        let cpus: Vec<usize> = (0..self.cpus.len().min(64))
            .filter(|p| set & (1u64 << p) != 0)
            .map(|p| self.cpus[p])
            .collect();
        self.set_affinity(tid, &cpus);
        self.rebinds += 1;
    }

    fn bind_wide(&self, tid: libc::pid_t) {
        self.set_affinity(tid, &self.cpus);
    }

    fn set_affinity(&self, tid: libc::pid_t, cpus: &[usize]) {
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            // SAFETY: cpu < CPU_SETSIZE (it came from CPU_ISSET over that range).
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: `set` is a valid cpu_set_t of the size given; `tid` is 0 (this thread) or a
        // registered vCPU thread of this process, still alive (it unregisters, under the
        // allocator's lock, before it ends). A failure leaves the thread where it was.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    }
}

/// Bind the threads of the vCPUs just granted a processor (`granted`, before they are woken) to
/// free processors: their own if it is free, else the lowest free one. Processors held by other
/// vCPUs (running, being revoked, granted earlier) are not free. While placement is widened,
/// the processor is recorded and the thread may run on any CPU.
pub(super) fn place_granted(state: &mut State, granted: &[(GuestId, usize)]) {
    place_granted_at(state, granted, Instant::now());
}

fn place_granted_at(state: &mut State, granted: &[(GuestId, usize)], now: Instant) {
    if state.placement.cpus.is_empty() {
        return;
    }
    let mut used: Vec<usize> = state
        .guests
        .iter()
        .enumerate()
        .flat_map(|(id, g)| {
            g.vcpus
                .iter()
                .enumerate()
                .filter(|(_, s)| s.holds_processor())
                .map(move |(v, _)| (id, v))
        })
        .filter(|w| !granted.contains(w))
        .filter_map(|(id, v)| state.placement.threads[id][v].processor)
        .collect();
    let budget = state.budget;
    let placement = &mut state.placement;
    let wide = placement.widened(now);
    for &(id, v) in granted {
        let thread = placement.threads[id][v];
        // Timed only once its thread exists: a thread still being created (vCPU creation takes
        // milliseconds at boot) is not waiting behind another.
        placement.threads[id][v].granted_at = (thread.tid != 0).then_some(now);
        let own = thread
            .processor
            .filter(|p| *p < budget && !used.contains(p));
        let Some(processor) = own.or_else(|| (0..budget).find(|p| !used.contains(p))) else {
            continue;
        };
        used.push(processor);
        placement.threads[id][v].processor = Some(processor);
        if wide {
            if !thread.wide {
                placement.threads[id][v].wide = true;
                placement.threads[id][v].set = 0;
                if thread.tid != 0 {
                    placement.bind_wide(thread.tid);
                }
            }
            continue;
        }
        if thread.processor == Some(processor) && !thread.wide && thread.set == 0 {
            continue;
        }
        placement.threads[id][v].wide = false;
        placement.threads[id][v].set = 0;
        if thread.tid != 0 {
            placement.bind(thread.tid, processor);
        }
    }
    narrow_guest_sets(state);
}

/// The processors (bits) of the vCPUs of guest `id` that hold one, when its threads may share
/// them: no other guest holds or wants a processor, and the budget has no more processors than
/// bits. Else 0: each thread is bound to its own processor's CPU. With `running`, only the
/// processors of running vCPUs count (a granted thread starts alone on its processor's CPU).
/// A guest of normal priority whose only company runs at the host's idle priority: every
/// processor (see the module).
fn held_set(state: &State, id: GuestId, running: bool) -> u64 {
    let idle = &state.placement.idle;
    let idle_at = |o: GuestId| idle.get(o).copied().unwrap_or(false);
    let mut company = state
        .guests
        .iter()
        .enumerate()
        .filter(|(o, g)| *o != id && (g.holding() > 0 || g.demand() > 0));
    let cpus = state.placement.cpus.len();
    if cpus > 64 {
        return 0;
    }
    if let Some((first, _)) = company.next() {
        let all_idle = idle_at(first) && company.all(|(o, _)| idle_at(o));
        return if all_idle && !idle_at(id) {
            (0..cpus).fold(0, |set, p| set | 1u64 << p)
        } else {
            0
        };
    }
    let g = &state.guests[id];
    (0..g.vcpus.len())
        .filter(|&v| {
            g.vcpus[v].holds_processor() && (!running || matches!(g.vcpus[v], Slot::Running(_)))
        })
        .filter_map(|v| state.placement.threads[id][v].processor)
        .filter(|&p| p < 64)
        .fold(0, |set, p| set | 1u64 << p)
}

/// The quantum's look: in each guest that no other guest shares the processors with, every
/// running vCPU thread may run on the CPUs of all the processors its running vCPUs hold (no
/// thread moves: each runs on one of them; see the module). Not at a thread's start: each
/// call costs its thread's start a few microseconds (the `PREEMPTED` upcall's latency).
pub(super) fn share_cpus_in_lone_guests(state: &mut State) {
    if state.placement.cpus.is_empty() || state.placement.widened(Instant::now()) {
        return;
    }
    for id in 0..state.guests.len() {
        share_cpus_in_guest(state, id);
    }
}

fn share_cpus_in_guest(state: &mut State, id: GuestId) {
    let held = held_set(state, id, true);
    if held.count_ones() < 2 {
        return;
    }
    for v in 0..state.guests[id].vcpus.len() {
        let thread = state.placement.threads[id][v];
        let running = matches!(state.guests[id].vcpus[v], Slot::Running(_));
        let own = thread
            .processor
            .is_some_and(|p| p < 64 && held & (1u64 << p) != 0);
        if !running || !own || thread.wide || thread.set == held {
            continue;
        }
        state.placement.threads[id][v].set = held;
        if thread.tid != 0 {
            state.placement.bind_set(thread.tid, held);
        }
    }
}

/// After grants: a thread bound to its guest's set that names a processor no running vCPU of
/// the guest holds now (given away, or granted to a vCPU that has not started on it yet), or
/// whose guest now has company, is bound to the set its guest may share now, or to its own
/// processor's CPU: guests' CPUs stay disjoint, and a granted thread finds its CPU free.
fn narrow_guest_sets(state: &mut State) {
    for id in 0..state.guests.len() {
        let held = held_set(state, id, true);
        for v in 0..state.guests[id].vcpus.len() {
            let thread = state.placement.threads[id][v];
            if thread.set == 0 || (held != 0 && thread.set & !held == 0) {
                continue;
            }
            match thread.processor {
                Some(p) if p < 64 && held & (1u64 << p) != 0 && held.count_ones() >= 2 => {
                    state.placement.threads[id][v].set = held;
                    if thread.tid != 0 {
                        state.placement.bind_set(thread.tid, held);
                    }
                }
                Some(p) => {
                    state.placement.threads[id][v].set = 0;
                    if thread.tid != 0 {
                        state.placement.bind(thread.tid, p);
                    }
                }
                None => state.placement.threads[id][v].set = 0,
            }
        }
    }
}

/// The quantum's look: a vCPU granted more than [`SLOW_START`] ago whose thread has not
/// started yet widens placement at once, so the kernel may move that thread off its busy CPU.
pub(super) fn widen_if_slow(state: &mut State, now: Instant) {
    if state.placement.cpus.is_empty() {
        return;
    }
    let mut slow = false;
    for (id, g) in state.guests.iter().enumerate() {
        for (v, slot) in g.vcpus.iter().enumerate() {
            let thread = &mut state.placement.threads[id][v];
            if !matches!(slot, Slot::GrantedNew | Slot::GrantedResume) {
                // A grant withdrawn before its thread took it.
                thread.granted_at = None;
                continue;
            }
            slow |= thread
                .granted_at
                .is_some_and(|at| now.saturating_duration_since(at) > SLOW_START);
        }
    }
    if slow {
        state.placement.widen(now);
    }
}

#[cfg(test)]
mod tests;
