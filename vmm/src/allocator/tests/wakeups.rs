//! Timed wake-ups and yields: a latency-critical guest's wake-up as a backstop, following the
//! sleeper it was for, and what a later yield does to it.

use super::*;

#[test]
fn a_timed_wake_up_restarts_its_own_vcpu_and_is_a_backstop_beside_a_running_one() {
    let (alloc, server, batch) = server_beside_batch(2);
    settle_pass(&alloc, &[server, batch]);
    settle_pass(&alloc, &[server, batch]);
    // The server gives its processor back; the batch guest takes it.
    for v in 0..2 {
        if matches!(alloc.view(server).vcpus[v], Slot::Running(_)) {
            alloc.release(server, v, Release::Yielded);
        }
    }
    settle_pass(&alloc, &[server, batch]);
    assert!(matches!(alloc.view(batch).vcpus[0], Slot::Running(_)));
    // vCPU 1's timer is due: the batch vCPU is revoked, and the processor it frees goes to
    // vCPU 1 (not to the first parked vCPU, whose restart would leave vCPU 1 asking again).
    assert_eq!(alloc.wake_for_timer(server, 1), vec![(batch, 0)]);
    alloc.release(batch, 0, Release::Preempted);
    assert_eq!(alloc.view(server).vcpus, [Slot::Parked, Slot::GrantedNew]);
    assert_eq!(alloc.acquire(server, 1), Acquired::NewActivation);
    // vCPU 0 yields until a timer while vCPU 1 runs: its wake-up is only a backstop, later.
    let at = Instant::now() + Duration::from_millis(1);
    let mut asked = at;
    assert_eq!(alloc.yield_until(server, 0, &mut asked), None);
    assert_eq!(asked, at + super::timed::WAKE_BACKSTOP);
}

#[test]
fn a_yield_records_its_wake_up_before_the_granted_vcpu_can_start() {
    // The yield grants the processor and records the wake-up in one step: the batch vCPU
    // granted it, once started, carries the wake-up even if the yielding thread has not run
    // since (a host scheduler may keep it off its CPU for a tick).
    let (alloc, server, batch) = server_running_beside_batch();
    let at = Instant::now() + Duration::from_millis(1);
    let mut asked = at;
    let (_, carriers) = alloc.yield_processor(server, 0, Some(&mut asked), false);
    assert_eq!(carriers, Some((vec![(batch, 0)], at)));
    assert!(matches!(
        alloc.view(batch).vcpus[0],
        Slot::GrantedResume | Slot::GrantedNew
    ));
    assert_eq!(alloc.next_timed_wake(batch), Some(at));
    // Without a wake-up time it is a plain yield.
    let (_, carriers) = alloc.yield_processor(batch, 0, None, false);
    assert_eq!(carriers, None);
}

#[test]
fn a_yield_from_an_activation_started_after_another_yield_supersedes_its_wake_up() {
    use super::timed::{TimerDue, WAKE_SLACK};
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let server = alloc.add_guest(2);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    settle(&alloc, server);
    assert!(running(&alloc, server, 0) && running(&alloc, server, 1));
    // vCPU 0 yields for a sleeper due now (a backstop: vCPU 1 runs), then vCPU 1 for a later
    // one. vCPU 1's activation started before vCPU 0's yield: its scheduler may have looked at
    // the timers before vCPU 0's sleeper was there, so vCPU 0's wake-up stands and is carried
    // out.
    let mut at0 = Instant::now();
    alloc.yield_processor(server, 0, Some(&mut at0), false);
    let mut at1 = Instant::now() + Duration::from_secs(1);
    alloc.yield_processor(server, 1, Some(&mut at1), false);
    std::thread::sleep(at0.saturating_duration_since(Instant::now()) + WAKE_SLACK);
    assert!(matches!(alloc.timer_due(server, 0), TimerDue::Woken(_)));
    assert_eq!(alloc.timer_due(server, 1), TimerDue::Later(at1));
    settle(&alloc, server);
    assert!(running(&alloc, server, 0));
    // vCPU 0's new activation started after vCPU 1 yielded: its yield's wake-up covers every
    // sleeper of vCPU 1's still asleep (the guest's timers are one list), and vCPU 1's is
    // dropped, on its own thread and on the carriers alike.
    let mut at2 = Instant::now() + Duration::from_secs(2);
    alloc.yield_processor(server, 0, Some(&mut at2), false);
    assert_eq!(alloc.timer_due(server, 1), TimerDue::Gone);
    assert!(alloc.fire_due_wakes().is_empty());
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Later(at2));
    // A yield without a wake-up (no sleeper left) from a newer activation drops it the same way.
    alloc.wake_for_timer(server, 1);
    settle(&alloc, server);
    assert!(running(&alloc, server, 1));
    alloc.yield_processor(server, 1, None, false);
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Gone);
    assert_eq!(alloc.view(server).vcpus, [Slot::Parked, Slot::Parked]);
}

/// A probe for [`Allocator::watch_sleepers`] that reads the returned cells: the earliest
/// sleeper (ns; `u64::MAX`: none sleeps) and the idle vCPUs (none at first).
type SleeperCells = Arc<[std::sync::atomic::AtomicU64; 2]>;
fn sleeper_cells(alloc: &Allocator, guest: GuestId) -> SleeperCells {
    use std::sync::atomic::{AtomicU64, Ordering};
    let cells: SleeperCells = Arc::new([AtomicU64::new(u64::MAX), AtomicU64::new(0)]);
    let read = Arc::clone(&cells);
    alloc.watch_sleepers(
        guest,
        SleeperProbe(Arc::new(move || {
            Some(Sleepers {
                earliest_ns: read[0].load(Ordering::Relaxed),
                idle_vcpus: read[1].load(Ordering::Relaxed),
            })
        })),
    );
    cells
}

#[test]
fn a_timed_wake_up_follows_the_sleeper_it_was_for() {
    use super::timed::WAKE_SLACK;
    use std::sync::atomic::Ordering;
    const SECOND: u64 = 1_000_000_000;
    let (alloc, server, batch) = server_running_beside_batch();
    let cells = sleeper_cells(&alloc, server);
    let earliest = &cells[0];
    // The server yields until just before its sleeper due at 1 s of its clock; the batch
    // vCPU granted the processor carries the wake-up.
    earliest.store(SECOND, Ordering::Relaxed);
    let mut at = Instant::now() + Duration::from_millis(1);
    let (_, carriers) = alloc.yield_processor(server, 0, Some(&mut at), true);
    assert_eq!(carriers, Some((vec![(batch, 0)], at)));
    // Meanwhile that sleeper was woken (the earliest is now one 5 ms later): when due, the
    // wake-up moves 5 ms on and the processor stays with the batch guest.
    earliest.store(SECOND + 5_000_000, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1) + WAKE_SLACK);
    assert!(alloc.fire_due_wakes().is_empty());
    let moved = at + Duration::from_millis(5);
    assert_eq!(alloc.next_timed_wake(batch), Some(moved));
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Later(moved));
    assert_eq!(alloc.view(server).wakes_moved, 1);
    // Nobody sleeps any more when it comes due: dropped.
    earliest.store(u64::MAX, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(5) + WAKE_SLACK);
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Gone);
    assert_eq!(alloc.next_timed_wake(batch), None);
    assert_eq!(alloc.view(server).wakes_dropped, 1);
    assert_eq!(alloc.view(server).vcpus[0], Slot::Parked);

    // A sleeper still asleep gets its wake-up as asked.
    let (alloc, server, _) = server_running_beside_batch();
    let cells = sleeper_cells(&alloc, server);
    let earliest = &cells[0];
    earliest.store(SECOND, Ordering::Relaxed);
    let mut at = Instant::now();
    alloc.yield_processor(server, 0, Some(&mut at), true);
    assert!(matches!(alloc.timer_due(server, 0), TimerDue::Woken(_)));
}

#[test]
fn two_yields_for_one_sleeper_leave_one_wake_up() {
    use std::sync::atomic::Ordering;
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let server = alloc.add_guest(2);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    let cells = sleeper_cells(&alloc, server);
    let earliest = &cells[0];
    for v in 0..2 {
        assert_eq!(alloc.acquire(server, v), Acquired::Resume);
    }
    // vCPU 0 yields for the guest's earliest sleeper while vCPU 1 runs (its wake-up is a
    // backstop, later); vCPU 1, whose activation started before, then yields for the same one.
    earliest.store(1_000_000_000, Ordering::Relaxed);
    let mut at0 = Instant::now() + Duration::from_secs(1);
    alloc.yield_processor(server, 0, Some(&mut at0), true);
    let mut at1 = Instant::now() + Duration::from_secs(1);
    alloc.yield_processor(server, 1, Some(&mut at1), true);
    assert!(at1 < at0, "vCPU 0's wake-up was moved later (backstop)");
    // One new activation wakes every sleeper due then: the earlier wake-up alone stays.
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Gone);
    assert_eq!(alloc.timer_due(server, 1), TimerDue::Later(at1));
    assert_eq!(alloc.view(server).wakes_dropped, 1);
}

#[test]
fn a_wake_up_whose_sleeper_woke_beside_a_busy_vcpu_stands() {
    use super::timed::WAKE_SLACK;
    use std::sync::atomic::Ordering;
    const SECOND: u64 = 1_000_000_000;
    for idle in [false, true] {
        let alloc = Allocator::new(2, Duration::from_millis(10));
        let server = alloc.add_guest(2);
        alloc.set_latency_critical(server, true);
        alloc.set_activations(server, true);
        let cells = sleeper_cells(&alloc, server);
        for v in 0..2 {
            assert_eq!(alloc.acquire(server, v), Acquired::Resume);
        }
        // vCPU 0 yields for the earliest sleeper; vCPU 1, still running, wakes it.
        cells[0].store(SECOND, Ordering::Relaxed);
        let mut at = Instant::now();
        alloc.yield_processor(server, 0, Some(&mut at), true);
        cells[0].store(SECOND + 5_000_000, Ordering::Relaxed);
        cells[1].store(if idle { 0b10 } else { 0 }, Ordering::Relaxed);
        std::thread::sleep(at.saturating_duration_since(Instant::now()) + WAKE_SLACK);
        let due = alloc.timer_due(server, 0);
        if idle {
            // vCPU 1 ran it and idles: the wake-up moves on to the next sleeper.
            assert_eq!(due, TimerDue::Later(at + Duration::from_millis(5)));
        } else {
            // vCPU 1 is busy: the woken sleeper may wait behind its thread, so vCPU 0 still
            // gets a processor to run it beside.
            assert!(matches!(due, TimerDue::Woken(_)), "{due:?}");
        }
    }
}
