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
//! `--pcpus`); never for host-scheduled runs (`--host-sched`), which are the baseline. With it
//! on, the chaos soak used to stall in a few runs of a hundred: the host's KVM left the upcall
//! vector requested and undelivered; the upcall watchdog (`Guest::watch_upcall_queues`,
//! `vcpu/redeliver.rs`) now delivers it.
//! A thread is re-bound only when its processor changes (one `sched_setaffinity`: ~1.3 us of
//! CPU time on a sleeping thread here); a vCPU that gets its own processor back costs nothing.

use super::{GuestId, State};

/// The host CPUs behind the processors, and the threads bound to them.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// Host CPUs this process may run on, in order; empty: placement is off.
    cpus: Vec<usize>,
    /// Per guest, per vCPU: its thread (0 until it registers) and the processor it is bound to.
    threads: Vec<Vec<(libc::pid_t, Option<usize>)>>,
    /// Threads re-bound so far (`sched_setaffinity` calls), for `--stats`.
    pub(super) rebinds: u64,
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
        self.threads.push(vec![(0, None); nr_vcpus]);
    }

    /// The thread of `vcpu` of `guest` is `tid` (the calling thread); it binds itself to the
    /// processor it was granted before it registered, if any.
    pub(super) fn register(&mut self, guest: GuestId, vcpu: usize, tid: libc::pid_t) {
        let Some(entry) = self.threads.get_mut(guest).and_then(|g| g.get_mut(vcpu)) else {
            return;
        };
        entry.0 = tid;
        if let Some(processor) = entry.1 {
            self.bind(0, processor);
        }
    }

    /// The thread of `vcpu` of `guest` ends: never touch its id again (it may be reused).
    pub(super) fn unregister(&mut self, guest: GuestId, vcpu: usize) {
        if let Some(entry) = self.threads.get_mut(guest).and_then(|g| g.get_mut(vcpu)) {
            entry.0 = 0;
        }
    }

    fn bind(&mut self, tid: libc::pid_t, processor: usize) {
        let cpu = self.cpus[processor % self.cpus.len()];
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: cpu < CPU_SETSIZE (it came from CPU_ISSET over that range).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: `set` is a valid cpu_set_t of the size given; `tid` is 0 (this thread) or a
        // registered vCPU thread of this process, still alive (it unregisters, under the
        // allocator's lock, before it ends). A failure leaves the thread where it was.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        self.rebinds += 1;
    }
}

/// Bind the threads of the vCPUs just granted a processor (`granted`, before they are woken) to
/// free processors: their own if it is free, else the lowest free one. Processors held by other
/// vCPUs (running, being revoked, granted earlier) are not free.
pub(super) fn place_granted(state: &mut State, granted: &[(GuestId, usize)]) {
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
        .filter_map(|(id, v)| state.placement.threads[id][v].1)
        .collect();
    let budget = state.budget;
    let placement = &mut state.placement;
    for &(id, v) in granted {
        let (tid, bound) = placement.threads[id][v];
        let own = bound.filter(|p| *p < budget && !used.contains(p));
        let Some(processor) = own.or_else(|| (0..budget).find(|p| !used.contains(p))) else {
            continue;
        };
        used.push(processor);
        if bound == Some(processor) {
            continue;
        }
        placement.threads[id][v].1 = Some(processor);
        if tid != 0 {
            placement.bind(tid, processor);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Acquired, Allocator, Release};

    /// The processor each vCPU of guest 0 is bound to.
    fn bound(alloc: &Allocator) -> Vec<Option<usize>> {
        alloc.lock().placement.threads[0]
            .iter()
            .map(|t| t.1)
            .collect()
    }

    #[test]
    fn a_granted_vcpu_takes_the_freed_processor_or_keeps_its_own() {
        let alloc = Allocator::new(2, Duration::ZERO);
        // Two host CPUs and no thread registered: the bindings are recorded, no call is made.
        alloc.lock().placement.cpus = vec![0, 1];
        let g = alloc.add_guest(3);
        assert!(alloc.rebalance().is_empty());
        assert_eq!(bound(&alloc), [Some(0), Some(1), None]);
        assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
        assert_eq!(alloc.acquire(g, 1), Acquired::Resume);
        // vCPU 0 gives processor 0 back: the waiting vCPU 2 gets that one, not vCPU 1's.
        alloc.release(g, 0, Release::Descheduled);
        assert_eq!(bound(&alloc), [Some(0), Some(1), Some(0)]);
        assert_eq!(alloc.acquire(g, 2), Acquired::Resume);
        // vCPU 1 gives processor 1 back: vCPU 0's own is taken, so it moves to processor 1.
        alloc.release(g, 1, Release::Descheduled);
        assert_eq!(bound(&alloc), [Some(1), Some(1), Some(0)]);
        assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
        assert_eq!(alloc.lock().placement.rebinds, 0);
    }
}
