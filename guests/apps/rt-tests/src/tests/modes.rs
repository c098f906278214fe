//! Modes that end the guest: a stack overflow, a panic, a fault.

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
