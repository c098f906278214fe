//! Placement: processors on host CPUs, shared sets, widening.

use std::time::{Duration, Instant};

use super::super::{Acquired, Allocator, Release, Slot};
use super::{SLOW_START, WIDE_FOR};

/// The processor each vCPU of guest 0 is bound to.
fn bound(alloc: &Allocator) -> Vec<Option<usize>> {
    alloc.lock().placement.threads[0]
        .iter()
        .map(|t| t.processor)
        .collect()
}

/// Whether each vCPU thread of guest 0 may run on any CPU.
fn wide(alloc: &Allocator) -> Vec<bool> {
    alloc.lock().placement.threads[0]
        .iter()
        .map(|t| t.wide)
        .collect()
}

/// Two host CPUs, no thread registered (bindings are recorded, no call is made), and a
/// guest of `vcpus` vCPUs granted its first processors.
fn placed(vcpus: usize) -> Allocator {
    let alloc = Allocator::new(2, Duration::ZERO);
    alloc.lock().placement.cpus = vec![0, 1];
    alloc.add_guest(vcpus);
    assert!(alloc.rebalance().is_empty());
    alloc
}

/// Make the grant of `vcpu` of guest 0 look `ago` old.
fn granted_ago(alloc: &Allocator, vcpu: usize, ago: Duration) {
    alloc.lock().placement.threads[0][vcpu].granted_at = Some(Instant::now() - ago);
}

/// Make the grant of `vcpu` of guest 0 one that cannot turn late while the test runs,
/// however slowly the machine runs it.
fn granted_just_now(alloc: &Allocator, vcpu: usize) {
    alloc.lock().placement.threads[0][vcpu].granted_at =
        Some(Instant::now() + Duration::from_secs(3600));
}

#[test]
fn a_granted_vcpu_takes_the_freed_processor_or_keeps_its_own() {
    let alloc = placed(3);
    let g = 0;
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

/// The processor sets (bits) the vCPU threads of `guest` are bound to (0: their own).
fn sets(alloc: &Allocator, guest: usize) -> Vec<u64> {
    alloc.lock().placement.threads[guest]
        .iter()
        .map(|t| t.set)
        .collect()
}

#[test]
fn a_guest_alone_runs_on_all_its_processors_and_shares_none() {
    let alloc = placed(2);
    alloc.set_activations(0, true);
    // Granted, not started: each is bound to its own processor's CPU (a prompt start).
    assert_eq!(sets(&alloc, 0), [0, 0]);
    assert_eq!(alloc.acquire(0, 0), Acquired::Resume);
    assert_eq!(
        sets(&alloc, 0),
        [0, 0],
        "one processor held: nothing to widen to"
    );
    assert_eq!(alloc.acquire(0, 1), Acquired::Resume);
    assert_eq!(
        sets(&alloc, 0),
        [0, 0],
        "widened by the quantum, off the start's path"
    );
    assert!(alloc.rebalance().is_empty());
    // Both running: each may run on both CPUs, where Linux places it.
    assert_eq!(sets(&alloc, 0), [0b11, 0b11]);
    // A second guest takes one processor: the first guest's threads are bound to the one
    // it keeps, so the guests' CPUs stay disjoint.
    let h = alloc.add_guest(1);
    let kicks = alloc.rebalance();
    assert_eq!(kicks.len(), 1);
    let (g, v) = kicks[0];
    alloc.release(g, v, Release::Preempted);
    assert_eq!(alloc.acquire(h, 0), Acquired::Resume);
    let kept = 1 - v;
    assert_eq!(sets(&alloc, 0)[kept], 0, "bound to its own processor again");
    assert_eq!(sets(&alloc, h), [0]);
    assert_ne!(
        bound(&alloc)[kept],
        alloc.lock().placement.threads[h][0].processor
    );
}

#[test]
fn a_guest_beside_idle_priority_guests_runs_on_every_cpu() {
    // A one-vCPU guest beside a one-vCPU guest at the host's idle priority: each holds a
    // processor; the first may run on both CPUs, the idle-priority one on its own only.
    let alloc = placed(1);
    let h = alloc.add_guest(1);
    alloc.set_host_idle_priority(h, true);
    assert!(alloc.rebalance().is_empty());
    assert_eq!(alloc.acquire(0, 0), Acquired::Resume);
    assert_eq!(alloc.acquire(h, 0), Acquired::Resume);
    assert!(alloc.rebalance().is_empty());
    assert_eq!(sets(&alloc, 0), [0b11]);
    assert_eq!(sets(&alloc, h), [0]);
    // Both of normal priority: disjoint again at the next grant.
    alloc.set_host_idle_priority(h, false);
    alloc.release(h, 0, Release::Descheduled);
    assert_eq!(sets(&alloc, 0), [0]);
}

#[test]
fn a_slow_start_widens_placement_until_it_calms_down() {
    let alloc = placed(3);
    // vCPU 0 starts promptly, vCPU 1 long after its grant: its CPU was busy.
    assert_eq!(alloc.acquire(0, 0), Acquired::Resume);
    granted_ago(&alloc, 1, SLOW_START * 2);
    assert_eq!(alloc.acquire(0, 1), Acquired::Resume);
    assert_eq!(alloc.lock().placement.widenings, 1);
    assert_eq!(wide(&alloc), [true; 3]);
    // Widened, a grant still records its processor but binds nothing.
    alloc.release(0, 0, Release::Descheduled);
    assert_eq!(bound(&alloc), [Some(0), Some(1), Some(0)]);
    assert_eq!(wide(&alloc), [true; 3]);
    assert_eq!(alloc.acquire(0, 2), Acquired::Resume);
    // Calm for WIDE_FOR: the next grant binds its thread to its processor again.
    alloc.lock().placement.wide_until = Some(Instant::now() - Duration::from_nanos(1));
    alloc.release(0, 1, Release::Descheduled);
    assert_eq!(bound(&alloc), [Some(1), Some(1), Some(0)]);
    assert_eq!(wide(&alloc), [false, true, true]);
    assert_eq!(alloc.lock().placement.widenings, 1);
    assert!(WIDE_FOR > SLOW_START);
}

#[test]
fn the_quantum_widens_for_a_grant_that_waits_too_long() {
    let alloc = placed(2);
    // Both granted; vCPU 1's thread has not started for longer than SLOW_START.
    assert_eq!(alloc.view(0).vcpus[1], Slot::GrantedResume);
    granted_just_now(&alloc, 0);
    granted_just_now(&alloc, 1);
    assert!(alloc.rebalance().is_empty());
    assert_eq!(alloc.lock().placement.widenings, 0, "not late yet");
    // A prompt start does not widen either.
    assert_eq!(alloc.acquire(0, 0), Acquired::Resume);
    assert_eq!(alloc.lock().placement.widenings, 0);
    assert_eq!(wide(&alloc), [false, false]);
    granted_ago(&alloc, 1, SLOW_START * 2);
    assert!(alloc.rebalance().is_empty());
    assert_eq!(alloc.lock().placement.widenings, 1);
    assert_eq!(wide(&alloc), [true, true]);
    // Its start, late as well, keeps it widened once (not a second widening).
    assert_eq!(alloc.acquire(0, 1), Acquired::Resume);
    assert_eq!(alloc.lock().placement.widenings, 1);
}

#[test]
fn a_grant_to_a_thread_still_being_created_is_not_timed() {
    // No thread registered yet (boot): the grants are not timed, whatever the quantum sees.
    let alloc = placed(2);
    assert!(alloc.lock().placement.threads[0]
        .iter()
        .all(|t| t.granted_at.is_none()));
    assert!(alloc.rebalance().is_empty());
    assert_eq!(alloc.lock().placement.widenings, 0);
}

#[test]
fn a_withdrawn_grant_does_not_widen() {
    let alloc = placed(2);
    granted_ago(&alloc, 1, SLOW_START * 2);
    // The guest stops vCPU 1 before its thread took the grant.
    alloc.release(0, 1, Release::Stopped);
    assert!(alloc.rebalance().is_empty());
    assert_eq!(alloc.lock().placement.widenings, 0);
    assert!(alloc.lock().placement.threads[0][1].granted_at.is_none());
}
