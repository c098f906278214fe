//! `fault-handover`: a thread faults, and while its CPU-exception handler reports the fault (on
//! its vCPU's exception stack, under a preemption hold) the simulated VMM takes it away and hands
//! its context to another vCPU. That context is the handler's, not the thread's: continued as
//! the thread's, it stopped the guest with "would resume with stack pointer ... outside its
//! stack". It must be continued as the handler, which ends the guest as any fault does: the
//! handler's report (now counting `exception_contexts: 1`), then the VMM's, status 125. Needs
//! the simulated VMM (`activm run --no-activations`) and 2 vCPUs.

use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;

use activm_rt::upcall::sim;
use activm_rt::{println, rt, thread};

pub fn fault_handover() -> i32 {
    static GO: AtomicBool = AtomicBool::new(false);
    if rt::nr_vcpus() < 2 {
        println!("fault-handover: needs 2 vCPUs");
        return 1;
    }
    let faulter = thread::Builder::new()
        .name("faulter".into())
        .spawn(|| {
            while !GO.load(Ordering::Acquire) {
                core::hint::spin_loop();
            }
            crate::regs::undefined_instruction()
        })
        .unwrap();
    // Only while it holds a preemption hold: in its thread code it holds none, so the capture
    // lands in the handler, which holds one from its start to the guest's end.
    let req = sim::request(
        sim::Capture::Preempt {
            deliver_to: rt::vcpu(),
        },
        Some(&faulter.thread()),
        Some(true),
    );
    GO.store(true, Ordering::Release);
    for _ in 0..50_000 {
        if req.is_done() {
            break;
        }
        sim::kick_all();
        thread::sleep(Duration::from_micros(200));
    }
    // The guest ends with the fault before this returns.
    let _ = faulter.join();
    println!(
        "fault-handover: the faulting thread returned (taken in its handler: {})",
        req.is_done()
    );
    1
}
