//! A guest's idle processors: which one it keeps, and what giving one back leaves in place.

use super::super::timed::TimerDue;
use super::*;

#[test]
fn a_latency_critical_guest_keeps_only_its_last_processor_for_its_io() {
    let alloc = Allocator::new(2, Duration::from_millis(10));
    let server = alloc.add_guest(2);
    let batch = alloc.add_guest(2);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    alloc.set_activations(batch, true);
    settle(&alloc, server);
    settle(&alloc, batch);
    assert!(running(&alloc, server, 0) && running(&alloc, server, 1));
    // The batch guest wants processors: an idle server vCPU beside a running one gives its
    // processor back (the running one takes the completions)...
    assert!(!alloc.keeps_processor_for_io(server, 0));
    assert!(!alloc.keeps_processor_for_io(server, 1));
    alloc.release(server, 1, Release::Yielded);
    // ...and the last one keeps it, warm for the next completion.
    assert!(alloc.keeps_processor_for_io(server, 0));
}

#[test]
fn an_untimed_yield_beside_a_running_vcpu_leaves_the_others_wake_ups() {
    let alloc = Allocator::new(3, Duration::from_millis(10));
    let server = alloc.add_guest(3);
    alloc.set_latency_critical(server, true);
    alloc.set_activations(server, true);
    settle(&alloc, server);
    assert!((0..3).all(|v| running(&alloc, server, v)));
    // vCPU 0, the guest's warm vCPU, gives its processor back until its sleeper is due.
    let mut at0 = Instant::now() + Duration::from_secs(1);
    alloc.yield_processor(server, 0, Some(&mut at0), true);
    let at0 = match alloc.timer_due(server, 0) {
        TimerDue::Later(at) => at,
        other => panic!("vCPU 0's wake-up: {other:?}"),
    };
    // vCPU 1 starts a new activation after that yield, then gives its processor back with no
    // wake-up while vCPU 2 still runs: it is not the guest's last processor, so its yield says
    // nothing about the guest's sleepers, and vCPU 0's wake-up stands.
    alloc.release(server, 1, Release::Yielded);
    alloc.wake_for_timer(server, 1);
    settle(&alloc, server);
    assert!(running(&alloc, server, 1));
    alloc.yield_processor(server, 1, None, false);
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Later(at0));
    // The last one's untimed yield, from an activation started after vCPU 0's yield, does
    // drop it: its scheduler found no sleeper left.
    alloc.release(server, 2, Release::Yielded);
    alloc.wake_for_timer(server, 2);
    settle(&alloc, server);
    assert!(running(&alloc, server, 2));
    alloc.yield_processor(server, 2, None, false);
    assert_eq!(alloc.timer_due(server, 0), TimerDue::Gone);
}
