//! Modes that end the guest: a stack overflow, a panic, a fault, a watchdog whose report never
//! returns; and one that never ends.

use alloc::string::String;
use core::hint::black_box;

use activm_rt::println;
use activm_rt::thread;

/// A thread runs off its stack: the guard page catches it.
pub fn overflow_mode() -> i32 {
    #[inline(never)]
    #[allow(unconditional_recursion)]
    fn recurse(depth: u64) -> u64 {
        let buf = [depth; 128];
        black_box(&buf);
        recurse(depth + 1).wrapping_add(buf[7])
    }
    let r = thread::Builder::new()
        .name("deep-recursion".into())
        .spawn(|| recurse(0))
        .unwrap()
        .join();
    println!("overflow: the recursion returned {r:?}?");
    1
}

/// A named thread panics: the guest ends with its name in the report.
pub fn panic_mode() -> i32 {
    let r = thread::Builder::new()
        .name("panicker".into())
        .spawn(|| {
            if black_box(true) {
                panic!("boom on purpose");
            }
        })
        .unwrap()
        .join();
    println!("panic: the thread returned {r:?}?");
    1
}

/// A named thread faults at user level: `bad-access` reads the unmapped null page,
/// `undefined` executes an undefined instruction. The runtime's exception handler prints its
/// report, then the fault recurs with exceptions fatal and the VMM ends the guest (status 125).
pub fn fault_mode(kind: &str) -> i32 {
    let kind = String::from(kind);
    let r = thread::Builder::new()
        .name("faulter".into())
        .spawn(move || match kind.as_str() {
            // SAFETY: address 8 lies in the null page, which is never mapped: the read faults (what
            // this mode tests) and never returns a value.
            "bad-access" => unsafe { core::ptr::read_volatile(black_box(8usize) as *const u64) },
            "undefined" => crate::regs::undefined_instruction(),
            // On our x86 hosts an MXCSR value with reserved bits raises #UD (not #GP); the
            // handler says what that means before the VMM's report.
            #[cfg(target_arch = "x86_64")]
            "bad-mxcsr" => {
                let value: u32 = 0xffff_ffff;
                // SAFETY: the load faults (what this mode tests) and never returns.
                unsafe {
                    core::arch::asm!("ldmxcsr [{v}]", v = in(reg) &value, options(nostack, readonly))
                };
                0
            }
            _ => 0,
        })
        .unwrap()
        .join();
    println!("fault: the thread returned {r:?} (modes: bad-access, undefined, bad-mxcsr)");
    1
}

/// Two named threads wait for each other on rendezvous channels and `main` joins one: nothing
/// ever runs again. Ended by the VMM's `--timeout`, whose hang report names the stuck threads.
pub fn deadlock_mode() -> i32 {
    use activm_rt::sync::mpsc::sync_channel;
    let (to_a, for_a) = sync_channel::<u32>(0);
    let (to_b, for_b) = sync_channel::<u32>(0);
    let a = thread::Builder::new()
        .name("deadlock-a".into())
        .spawn(move || {
            let got = for_a.recv();
            to_b.send(1).ok();
            got
        })
        .unwrap();
    let b = thread::Builder::new()
        .name("deadlock-b".into())
        .spawn(move || {
            let got = for_b.recv();
            to_a.send(2).ok();
            got
        })
        .unwrap();
    println!("deadlock: deadlock-a and deadlock-b wait for each other");
    let r = (a.join(), b.join());
    println!("deadlock: the threads returned {r:?}?");
    1
}

/// The watchdog fires and its report never returns (as when the VMM's taking the vCPU drops
/// the context that prints it: a timer interrupt on top of a new activation's first
/// instruction is discarded whole): another vCPU must still end the guest with status 99.
pub fn watchdog_lost_report_mode() -> i32 {
    use core::sync::atomic::{AtomicBool, Ordering};
    use core::time::Duration;
    static STOP: AtomicBool = AtomicBool::new(false);
    activm_rt::stats::set_watchdog_report(|| loop {
        core::hint::spin_loop();
    });
    let spinners: alloc::vec::Vec<_> = (0..2 * activm_rt::rt::nr_vcpus())
        .map(|_| {
            thread::spawn(|| {
                while !STOP.load(Ordering::Relaxed) {
                    black_box((0..1000u64).sum::<u64>());
                }
            })
        })
        .collect();
    println!("watchdog-lost-report: arming the watchdog; its report never returns");
    activm_rt::stats::set_watchdog(Some(Duration::from_millis(10)));
    thread::sleep(Duration::from_secs(20));
    STOP.store(true, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
    println!("watchdog-lost-report: the guest still runs 20 s after the watchdog was due");
    1
}
