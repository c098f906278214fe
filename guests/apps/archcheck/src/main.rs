//! aarch64 checks of the stub's EL1 paths, run by `cargo xtask aarch64-test`:
//!
//! * `irq` (default): vCPU 0 arms its virtual timer from EL0 again and again and sends itself
//!   SGIs (`svc #1`), while a loop keeps values in general and FP/SIMD registers and checks
//!   them: each interrupt goes EL1 -> EL0 trampoline -> handler -> `svc #0` return. Prints the
//!   counts and exits 0.
//! * `fault`: a load from an unmapped address at EL0; the VMM must report a data abort (status
//!   125).
//!
//! On x86_64 it only says there is nothing to check.
#![no_std]
#![no_main]

#[cfg(target_arch = "aarch64")]
mod aarch64 {
    use core::sync::atomic::{AtomicU64, Ordering};

    use activm_stub::arch::aarch64::irqchip;
    use activm_stub::protocol::arch::aarch64::{INTID_RESCHEDULE, INTID_VTIMER};
    use activm_stub::{args, exit, println, register_irq_handler, IrqFrame};

    static TICKS: AtomicU64 = AtomicU64::new(0);
    static SGIS: AtomicU64 = AtomicU64::new(0);
    const WANT: u64 = 50;

    fn on_timer(_frame: &mut IrqFrame) {
        if TICKS.fetch_add(1, Ordering::Relaxed) + 1 < WANT {
            irqchip::arm_timer_ticks(irqchip::counter_hz() / 2000);
        }
    }

    fn on_sgi(_frame: &mut IrqFrame) {
        SGIS.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps known values in x20-x28 and d8-d15 (and v16-v31) across a busy loop, and reports
    /// whether they survived every interrupt taken meanwhile.
    fn registers_survive(rounds: u64) -> bool {
        let bad: u64;
        // SAFETY: only registers declared as clobbered are used; no memory is touched.
        unsafe {
            core::arch::asm!(
                "mov x22, #19", "mov x20, #20", "mov x21, #21", "mov x28, #28",
                "fmov d8, x22", "fmov d15, x28", "dup v16.2d, x20", "dup v31.2d, x21",
                "2:",
                "sub {n}, {n}, #1",
                "cbnz {n}, 2b",
                "mov {bad}, #0",
                "cmp x22, #19", "cinc {bad}, {bad}, ne",
                "cmp x20, #20", "cinc {bad}, {bad}, ne",
                "cmp x21, #21", "cinc {bad}, {bad}, ne",
                "cmp x28, #28", "cinc {bad}, {bad}, ne",
                "fmov {t}, d8", "cmp {t}, #19", "cinc {bad}, {bad}, ne",
                "fmov {t}, d15", "cmp {t}, #28", "cinc {bad}, {bad}, ne",
                "mov {t}, v16.d[1]", "cmp {t}, #20", "cinc {bad}, {bad}, ne",
                "mov {t}, v31.d[1]", "cmp {t}, #21", "cinc {bad}, {bad}, ne",
                n = inout(reg) rounds => _,
                bad = out(reg) bad,
                t = out(reg) _,
                out("x22") _, out("x20") _, out("x21") _, out("x28") _,
                out("v8") _, out("v15") _, out("v16") _, out("v31") _,
                options(nomem, nostack),
            );
        }
        bad == 0
    }

    fn fault() -> ! {
        println!("archcheck: loading from unmapped address 0x10 at EL0");
        // SAFETY: deliberately faults; the VMM ends the guest.
        let value = unsafe { (0x10 as *const u64).read_volatile() };
        println!("archcheck: the load returned {value:#x}: no fault!");
        exit(1)
    }

    pub fn main(vcpu: u32) -> ! {
        if vcpu != 0 {
            activm_stub::vcpu_stop();
        }
        if args().any(|a| a == "fault") {
            fault();
        }
        register_irq_handler(INTID_VTIMER as u8, on_timer);
        register_irq_handler(INTID_RESCHEDULE as u8, on_sgi);
        irqchip::arm_timer_ticks(irqchip::counter_hz() / 2000);
        let mut intact = true;
        let mut rounds = 0u64;
        while TICKS.load(Ordering::Relaxed) < WANT || SGIS.load(Ordering::Relaxed) < WANT {
            if SGIS.load(Ordering::Relaxed) < WANT {
                irqchip::send_self_sgi(INTID_RESCHEDULE);
            }
            intact &= registers_survive(20_000);
            rounds += 1;
            if rounds > 1_000_000 {
                println!(
                    "archcheck: FAILED: only {} timer interrupts and {} SGIs arrived",
                    TICKS.load(Ordering::Relaxed),
                    SGIS.load(Ordering::Relaxed)
                );
                exit(1);
            }
        }
        irqchip::stop_timer();
        println!(
            "archcheck: {} timer interrupts and {} SGIs at EL0, registers {}",
            TICKS.load(Ordering::Relaxed),
            SGIS.load(Ordering::Relaxed),
            if intact { "intact" } else { "CORRUPTED" }
        );
        exit(if intact { 0 } else { 1 })
    }
}

#[cfg(target_arch = "aarch64")]
use aarch64::main;

#[cfg(not(target_arch = "aarch64"))]
fn main(_vcpu: u32) -> ! {
    activm_stub::println!("archcheck: nothing to check on this architecture");
    activm_stub::exit(0)
}

activm_stub::vcpu_entry!(main);
