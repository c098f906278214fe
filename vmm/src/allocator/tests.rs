//! The allocator's policy, decision by decision, without vCPU threads.

use super::*;

mod idle;
mod wakeups;

/// One pass over `guests`' vCPUs, in order: grants picked up, hand-offs released.
fn settle_pass(alloc: &Allocator, guests: &[GuestId]) {
    for &guest in guests {
        for v in 0..alloc.view(guest).vcpus.len() {
            match alloc.view(guest).vcpus[v] {
                Slot::GrantedNew | Slot::GrantedResume => {
                    alloc.acquire(guest, v);
                }
                Slot::HandOff => {
                    assert_eq!(alloc.acquire(guest, v), Acquired::HandOff);
                    alloc.release(guest, v, Release::Preempted);
                }
                _ => {}
            }
        }
    }
}

/// `guest` on `alloc` with every vCPU running: three passes of [`settle_pass`].
fn settle(alloc: &Allocator, guest: GuestId) {
    for _ in 0..3 {
        settle_pass(alloc, &[guest]);
    }
}

/// Whether vCPU `v` of `guest` holds a processor.
fn running(alloc: &Allocator, guest: GuestId, v: usize) -> bool {
    matches!(alloc.view(guest).vcpus[v], Slot::Running(_))
}

/// One processor shared by a latency-critical server of `server_vcpus` vCPUs and a batch guest
/// of one, both with activations.
fn server_beside_batch(server_vcpus: usize) -> (Allocator, GuestId, GuestId) {
    let alloc = Allocator::new(1, Duration::from_millis(10));
    let server = alloc.add_guest(server_vcpus);
    let batch = alloc.add_guest(1);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    alloc.set_activations(batch, true);
    (alloc, server, batch)
}

/// [`server_beside_batch`] with one server vCPU, which runs on the processor: the batch
/// guest's vCPU, preempted for it, has handed its context over.
fn server_running_beside_batch() -> (Allocator, GuestId, GuestId) {
    let (alloc, server, batch) = server_beside_batch(1);
    if alloc.view(server).vcpus[0] == Slot::GrantedResume {
        alloc.acquire(server, 0);
    }
    if alloc.view(batch).vcpus[0] == Slot::HandOff {
        assert_eq!(alloc.acquire(batch, 0), Acquired::HandOff);
        alloc.release(batch, 0, Release::Preempted);
    }
    (alloc, server, batch)
}

#[test]
fn water_fill_respects_demand_and_budget() {
    assert_eq!(water_fill(4, &[1, 8], 0), vec![1, 3]);
    assert_eq!(water_fill(6, &[6, 6], 0), vec![3, 3]);
    assert_eq!(water_fill(8, &[2, 2], 0), vec![2, 2]);
    assert_eq!(water_fill(0, &[2, 2], 0), vec![0, 0]);
    let odd: Vec<Vec<usize>> = (0..2).map(|r| water_fill(3, &[4, 4], r)).collect();
    assert_eq!(odd[0].iter().sum::<usize>(), 3);
    assert_ne!(odd[0], odd[1], "the odd processor rotates");
}

#[test]
fn everyone_runs_when_demand_fits() {
    let alloc = Allocator::new(4, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    let h = alloc.add_guest(2);
    assert!(alloc.rebalance().is_empty());
    for (guest, vcpu) in [(g, 0), (g, 1), (h, 0), (h, 1)] {
        assert_eq!(alloc.acquire(guest, vcpu), Acquired::Resume);
    }
}

#[test]
fn oblivious_vcpus_take_turns() {
    let alloc = Allocator::new(1, Duration::ZERO);
    let g = alloc.add_guest(2);
    alloc.rebalance();
    let first = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
        0
    } else {
        1
    };
    assert_eq!(alloc.acquire(g, first), Acquired::Resume);
    // A quantum (zero here) later, the running vCPU is revoked for the waiting one.
    assert_eq!(alloc.rebalance(), vec![(g, first)]);
    alloc.release(g, first, Release::Preempted);
    assert_eq!(alloc.acquire(g, 1 - first), Acquired::Resume);
}

#[test]
fn activation_guest_gets_new_activations_up_to_its_share() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let g = alloc.add_guest(4);
    alloc.rebalance();
    let running: Vec<usize> = (0..4)
        .filter(|&v| alloc.view(g).vcpus[v] == Slot::GrantedResume)
        .collect();
    assert_eq!(running.len(), 2);
    for &v in &running {
        alloc.acquire(g, v);
    }
    alloc.set_activations(g, true);
    // Its idle vCPUs park; the running ones stay; no time slicing inside the guest.
    for v in (0..4).filter(|v| !running.contains(v)) {
        alloc.release(g, v, Release::Yielded);
    }
    assert!(alloc.rebalance().is_empty());
    // One yields (it is idle): its processor is not granted back to the guest...
    alloc.release(g, running[0], Release::Yielded);
    let view = alloc.view(g);
    assert_eq!((view.wanted, view.share), (1, 1));
    assert!(!view.vcpus.contains(&Slot::GrantedNew));
    // ... until it asks for more: a parked vCPU starts as a new activation.
    alloc.set_concurrency(g, 4);
    let view = alloc.view(g);
    assert_eq!(
        view.vcpus
            .iter()
            .filter(|s| **s == Slot::GrantedNew)
            .count(),
        1
    );
}

/// The contract the guest's asks rely on (`guest-runtime`, `activation::sa::UNASKED`): a yield
/// sets the demand to what the guest holds less one, forgetting vCPUs preempted meanwhile; a
/// new activation for a timer raises it by one only; only an ask restores it. A guest that
/// asked only while a yielded vCPU had not started again ran on one processor of two.
#[test]
fn only_an_ask_restores_the_demand_a_yield_lowered() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let g = alloc.add_guest(4);
    alloc.set_activations(g, true);
    settle(&alloc, g);
    alloc.set_concurrency(g, 4);
    settle(&alloc, g);
    let holding = |alloc: &Allocator| {
        let view = alloc.view(g);
        (0..4)
            .filter(|&v| view.vcpus[v].holds_processor())
            .collect::<Vec<_>>()
    };
    let running = holding(&alloc);
    assert_eq!(running.len(), 2);
    // The budget drops to one: a vCPU is preempted (its context goes to the guest) and parks.
    for (guest, v) in alloc.set_budget(1) {
        alloc.release(guest, v, Release::Preempted);
    }
    let [alone] = holding(&alloc)[..] else {
        panic!("not one vCPU running: {:?}", alloc.view(g).vcpus);
    };
    // The one left yields until a sleeper is due, and starts again for it.
    alloc.release(g, alone, Release::Yielded);
    assert_eq!(alloc.view(g).wanted, 0);
    alloc.wake_for_timer(g, alone);
    settle(&alloc, g);
    assert_eq!(holding(&alloc), vec![alone]);
    // The budget is back: the vCPU preempted before the yield is not wanted any more...
    alloc.set_budget(2);
    settle(&alloc, g);
    assert_eq!((alloc.view(g).wanted, holding(&alloc).len()), (1, 1));
    // ... until the guest asks.
    alloc.set_concurrency(g, 4);
    settle(&alloc, g);
    assert_eq!(holding(&alloc).len(), 2);
}

#[test]
fn second_guest_takes_half_from_an_activation_guest() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    alloc.set_activations(g, true);
    assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
    assert_eq!(alloc.acquire(g, 1), Acquired::Resume);
    let h = alloc.add_guest(1);
    let kicks = alloc.rebalance();
    assert_eq!(kicks.len(), 1, "one of g's processors is revoked");
    let (kg, kv) = kicks[0];
    assert_eq!(kg, g);
    alloc.release(g, kv, Release::Preempted);
    assert_eq!(alloc.view(g).vcpus[kv], Slot::Parked);
    assert_eq!(alloc.acquire(h, 0), Acquired::Resume);
    // h ends: g gets its processor back as a new activation.
    alloc.remove_guest(h);
    assert_eq!(alloc.acquire(g, kv), Acquired::NewActivation);
}

#[test]
fn waiting_vcpus_hand_off_when_the_guest_enables_activations() {
    let alloc = Allocator::new(1, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    alloc.rebalance();
    let running = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
        0
    } else {
        1
    };
    assert_eq!(alloc.acquire(g, running), Acquired::Resume);
    alloc.set_activations(g, true);
    // The waiting vCPU will never get a processor: it must hand its context over.
    assert_eq!(alloc.acquire(g, 1 - running), Acquired::HandOff);
    alloc.release(g, 1 - running, Release::Preempted);
    assert_eq!(alloc.view(g).vcpus[1 - running], Slot::Parked);
}

#[test]
fn concurrency_limits_an_activation_guest() {
    let alloc = Allocator::new(4, Duration::from_millis(10));
    let g = alloc.add_guest(4);
    alloc.set_activations(g, true);
    for v in 0..4 {
        alloc.acquire(g, v);
    }
    let (previous, kicks) = alloc.set_concurrency(g, 1);
    assert_eq!(previous, 4);
    assert_eq!(kicks.len(), 3);
}

#[test]
fn a_cap_makes_an_oblivious_guest_share_fewer_processors() {
    let alloc = Allocator::new(4, Duration::from_millis(10));
    let g = alloc.add_guest(4);
    alloc.rebalance();
    for v in 0..4 {
        assert_eq!(alloc.acquire(g, v), Acquired::Resume);
    }
    let (_, kicks) = alloc.set_concurrency(g, 1);
    assert_eq!(
        kicks.len(),
        3,
        "three of its four vCPUs lose their processor"
    );
    assert_eq!(alloc.view(g).share, 1);
}

#[test]
fn a_blocked_vcpu_frees_its_processor_for_a_new_activation() {
    let alloc = Allocator::new(1, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    alloc.set_activations(g, true);
    let running = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
        0
    } else {
        1
    };
    assert_eq!(alloc.acquire(g, running), Acquired::Resume);
    alloc.release(g, 1 - running, Release::Yielded);
    assert_eq!(alloc.view(g).vcpus[1 - running], Slot::Parked);
    // It blocks on I/O: the processor goes to the parked vCPU as a new activation.
    alloc.release(g, running, Release::Blocked);
    assert_eq!(alloc.view(g).vcpus[running], Slot::Blocked);
    assert_eq!(alloc.acquire(g, 1 - running), Acquired::NewActivation);
    // Its request completes: its context goes to the guest, it parks.
    let (_, restarts) = alloc.unblock(g, running, true);
    assert!(!restarts, "the guest holds its whole share");
    assert_eq!(alloc.view(g).vcpus[running], Slot::Parked);
    // The other activation yields (idle): nobody takes its processor until the guest asks.
    alloc.release(g, 1 - running, Release::Yielded);
    assert!(!alloc.view(g).vcpus.contains(&Slot::GrantedNew));
    alloc.set_concurrency(g, 2);
    assert!(alloc.view(g).vcpus.contains(&Slot::GrantedNew));
}

#[test]
fn an_unblocked_vcpu_starts_the_activation_it_is_owed() {
    let alloc = Allocator::new(1, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    alloc.set_activations(g, true);
    let a = if alloc.view(g).vcpus[0] == Slot::GrantedResume {
        0
    } else {
        1
    };
    let b = 1 - a;
    assert_eq!(alloc.acquire(g, a), Acquired::Resume);
    alloc.release(g, b, Release::Yielded);
    // A blocks: B takes its processor; then B blocks too.
    alloc.release(g, a, Release::Blocked);
    assert_eq!(alloc.acquire(g, b), Acquired::NewActivation);
    alloc.release(g, b, Release::Blocked);
    // A's request completes: A itself starts the new activation the guest is owed.
    let (_, restarts) = alloc.unblock(g, a, true);
    assert!(restarts);
    assert_eq!(alloc.view(g).vcpus[a], Slot::GrantedNew);
}

#[test]
fn an_oblivious_blocked_vcpu_resumes_after_its_request() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let g = alloc.add_guest(1);
    let h = alloc.add_guest(2);
    alloc.rebalance();
    assert_eq!(alloc.acquire(g, 0), Acquired::Resume);
    alloc.release(g, 0, Release::Blocked);
    // Meanwhile the other guest may use both processors.
    assert_eq!(alloc.view(h).share, 2);
    let (_, restarts) = alloc.unblock(g, 0, false);
    assert!(!restarts);
    alloc.rebalance();
    assert!(matches!(
        alloc.view(g).vcpus[0],
        Slot::Runnable(_) | Slot::GrantedResume
    ));
}

#[test]
fn an_idle_guest_gives_processors_to_a_busy_one() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let idle = alloc.add_guest(2);
    let busy = alloc.add_guest(2);
    alloc.set_activations(idle, true);
    alloc.set_activations(busy, true);
    alloc.rebalance();
    for g in [idle, busy] {
        for v in 0..2 {
            match alloc.view(g).vcpus[v] {
                Slot::GrantedResume => assert_eq!(alloc.acquire(g, v), Acquired::Resume),
                Slot::HandOff => {
                    assert_eq!(alloc.acquire(g, v), Acquired::HandOff);
                    alloc.release(g, v, Release::Preempted);
                }
                _ => {}
            }
        }
    }
    assert_eq!((alloc.view(idle).share, alloc.view(busy).share), (1, 1));
    // The idle guest yields its only processor: the busy one gets both.
    let v = (0..2)
        .find(|&v| matches!(alloc.view(idle).vcpus[v], Slot::Running(_)))
        .unwrap();
    alloc.release(idle, v, Release::Yielded);
    assert_eq!(alloc.view(idle).share, 0);
    assert_eq!(alloc.view(busy).share, 2);
    // An event for the idle guest: it wants a processor again.
    alloc.want_one(idle);
    assert_eq!((alloc.view(idle).wanted, alloc.view(idle).share), (1, 1));
}

#[test]
fn a_latency_critical_guest_is_served_first() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let server = alloc.add_guest(4);
    let batch = alloc.add_guest(2);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    alloc.set_activations(batch, true);
    // The batch guest's waiting vCPUs hand their contexts over and park.
    for v in 0..2 {
        assert_eq!(alloc.acquire(batch, v), Acquired::HandOff);
        alloc.release(batch, v, Release::Preempted);
    }
    let share = |g| alloc.view(g).share;
    assert_eq!((share(server), share(batch)), (2, 0));
    // Idle, it gives both back: the batch guest takes them.
    for v in 0..4 {
        if alloc.view(server).vcpus[v] == Slot::GrantedResume {
            alloc.acquire(server, v);
        }
    }
    for v in 0..4 {
        alloc.release(server, v, Release::Yielded);
    }
    assert_eq!((share(server), share(batch)), (0, 2));
    for v in 0..2 {
        assert_eq!(alloc.acquire(batch, v), Acquired::NewActivation);
    }
    // Its timer is due: it wants one again and the batch guest loses one at once.
    let kicks = alloc.wake_for_timer(server, 0);
    assert_eq!((share(server), share(batch)), (1, 1));
    assert_eq!(kicks.len(), 1);
    assert_eq!(kicks[0].0, batch);
}

#[test]
fn a_running_best_effort_vcpu_fires_a_latency_critical_wake_up() {
    let (alloc, server, batch) = server_running_beside_batch();
    // The server yields until its timer: the batch guest's vCPU runs meanwhile.
    alloc.release(server, 0, Release::Yielded);
    match alloc.view(batch).vcpus[0] {
        Slot::GrantedResume => assert_eq!(alloc.acquire(batch, 0), Acquired::Resume),
        Slot::GrantedNew => assert_eq!(alloc.acquire(batch, 0), Acquired::NewActivation),
        other => panic!("batch vCPU {other:?}"),
    }
    let at = Instant::now() + Duration::from_millis(1);
    let mut asked = at;
    assert_eq!(
        alloc.yield_until(server, 0, &mut asked),
        Some((vec![(batch, 0)], at))
    );
    assert_eq!(asked, at);
    // A vCPU of the batch guest granted a processor now would arm itself for it.
    assert_eq!(alloc.next_timed_wake(batch), Some(at));
    assert_eq!(alloc.next_timed_wake(server), None);
    // Kicked early (by something else): nothing is due yet; the wake-up is still to come.
    assert!(alloc.fire_due_wakes().is_empty());
    assert_eq!(alloc.next_timed_wake(batch), Some(at));
    std::thread::sleep(Duration::from_millis(2));
    // Kicked at the time: the batch vCPU's own thread revokes itself for the server.
    assert_eq!(alloc.fire_due_wakes(), vec![(batch, 0)]);
    alloc.release(batch, 0, Release::Preempted);
    assert_eq!(alloc.acquire(server, 0), Acquired::NewActivation);
    // Done: later kicks find nothing to do.
    assert!(alloc.fire_due_wakes().is_empty());
    assert_eq!(alloc.next_timed_wake(batch), None);
    // A best-effort guest's yields are not timed this way.
    assert_eq!(alloc.yield_until(batch, 0, &mut asked), None);
}

#[test]
fn stopped_guest_exits_its_threads() {
    let alloc = Allocator::new(1, Duration::from_millis(10));
    let g = alloc.add_guest(2);
    alloc.remove_guest(g);
    assert_eq!(alloc.acquire(g, 0), Acquired::Exit);
    assert_eq!(alloc.acquire(g, 1), Acquired::Exit);
}

#[test]
fn wait_running_returns_when_the_granted_vcpu_picks_up_its_processor() {
    let alloc = std::sync::Arc::new(Allocator::new(2, Duration::from_millis(10)));
    let g = alloc.add_guest(2);
    alloc.set_activations(g, true);
    alloc.set_concurrency(g, 1);
    alloc.rebalance();
    let first = (0..2)
        .find(|&v| {
            matches!(
                alloc.view(g).vcpus[v],
                Slot::GrantedNew | Slot::GrantedResume
            )
        })
        .expect("a cap of 1 grants one vCPU");
    alloc.acquire(g, first);
    let (_, _, granted) = alloc.set_concurrency_granting(g, 2);
    assert_eq!(granted.len(), 1, "raising the cap grants the second vCPU");
    let v = granted[0];
    // Before the picker starts: it may pick its processor up before this thread runs again.
    let before = Instant::now();
    let picker = {
        let alloc = alloc.clone();
        std::thread::spawn(move || alloc.acquire(g, v))
    };
    let at = alloc.wait_running(g, &granted, Duration::from_secs(5));
    assert!(
        at.is_some_and(|at| at >= before),
        "the pick-up time is returned"
    );
    assert!(matches!(alloc.view(g).vcpus[v], Slot::Running(_)));
    picker.join().unwrap();
}
