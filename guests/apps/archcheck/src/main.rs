//! aarch64 checks of the stub's EL1 paths, run by `cargo xtask aarch64-test`:
//!
//! * `irq` (default): vCPU 0 arms its virtual timer from EL0 again and again and sends itself
//!   SGIs (`svc #1`), while a loop keeps values in general and FP/SIMD registers and checks
//!   them: each interrupt goes EL1 -> EL0 trampoline -> handler -> `svc #0` return. Prints the
//!   counts and exits 0.
//! * `fault`: a load from an unmapped address at EL0; the VMM must report a data abort (status
//!   125).
//! * `upcall` (2 vCPUs): vCPU 0 enables upcalls and sends vCPU 1 a USER upcall (`sa_preempt`);
//!   the VMM queues the record and raises vCPU 1's upcall SPI, whose handler must find it.
//! * `preempt` (2 vCPUs): vCPU 0 enables upcalls and lowers the concurrency to 1; the VMM takes
//!   one vCPU's processor and hands its EL0 context (read with ONE_REG) to the other in a
//!   PREEMPTED record, which must hold the spinning loop's registers.
//!
//! On x86_64 it only says there is nothing to check.
#![no_std]
#![no_main]

#[cfg(target_arch = "aarch64")]
mod aarch64 {
    use core::sync::atomic::{AtomicU64, Ordering};

    use activm_stub::arch::aarch64::irqchip;
    use activm_stub::protocol::arch::aarch64::{
        HYPERCALL_BASE, RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ,
    };
    use activm_stub::protocol::hypercall::Hypercall;
    use activm_stub::protocol::shared::{
        vcpu_area_offset, SharedHeader, UpcallKind, VcpuArea, UPCALL_QUEUE_CAPACITY,
    };
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

    static UPCALLS: AtomicU64 = AtomicU64::new(0);
    static GO: AtomicU64 = AtomicU64::new(0);
    static mut STACKS: [[u8; 4096]; 4] = [[0; 4096]; 4];

    fn area(vcpu: u32) -> &'static VcpuArea {
        let base = activm_stub::boot_info().shared_area;
        // SAFETY: the VMM maps the shared area EL0 read-write; vCPU i's area is at this offset.
        unsafe { &*((base + vcpu_area_offset(vcpu as usize) as u64) as *const VcpuArea) }
    }

    /// INTID 32 stands for every vCPU's upcall SPI: take the records of this vCPU's queue.
    fn on_upcall(_frame: &mut IrqFrame) {
        let area = area(activm_stub::vcpu_id());
        let head = area.queue_head.0.load(Ordering::Acquire);
        let mut tail = area.queue_tail.0.load(Ordering::Relaxed);
        while tail != head {
            let record = &area.records[tail as usize % UPCALL_QUEUE_CAPACITY];
            println!(
                "archcheck: upcall on vCPU {}: kind {} arg {} seq {}",
                activm_stub::vcpu_id(),
                record.kind,
                record.arg,
                record.seq
            );
            if record.kind == UpcallKind::User as u32 {
                UPCALLS.fetch_add(1, Ordering::Release);
            }
            if record.kind == UpcallKind::Preempted as u32 {
                let ctx = &record.context;
                let image = 0x20_0000..0x40_0000;
                let ok = image.contains(&ctx.pc) && ctx.pstate & 0xf == 0 && ctx.x[27] == MARK;
                println!(
                    "archcheck: PREEMPTED context of vCPU {}: pc {:#x} sp {:#x} pstate {:#x} x27 {:#x}: {}",
                    record.vcpu,
                    ctx.pc,
                    ctx.sp,
                    ctx.pstate,
                    ctx.x[27],
                    if ok { "EL0 in the image, registers as left" } else { "WRONG" }
                );
                exit(if ok { 0 } else { 1 });
            }
            tail = tail.wrapping_add(1);
        }
        area.queue_tail.0.store(tail, Ordering::Release);
    }

    extern "C" fn new_activation() -> ! {
        println!("archcheck: FAILED: unexpected new activation");
        exit(1)
    }

    fn call(nr: Hypercall, a0: u64, a1: u64) -> u64 {
        // SAFETY: the sa_* calls take plain numbers or the address of a function of the image.
        unsafe { activm_stub::hypercall::raw(nr as u64, a0, a1, 0, 0) }
    }

    /// What the spinning vCPUs keep in x27 for the PREEMPTED record to show.
    const MARK: u64 = 0xa5a5_0027;

    /// Puts the marker in x27, optionally makes the hypercall at `call_addr` with x0 = `arg`
    /// (0: none), then spins: wherever the VMM takes this vCPU, x27 holds the marker.
    fn spin_marked(call_addr: u64, arg: u64) -> ! {
        // SAFETY: the optional hypercall takes a plain number; then this spins forever.
        unsafe {
            core::arch::asm!(
                "mov x27, {m}",
                "cbz x8, 2f",
                "ldr x0, [x8]",
                "2: b 2b",
                m = in(reg) MARK,
                in("x8") call_addr,
                in("x0") arg,
                options(noreturn, nostack)
            )
        }
    }

    fn enable_upcalls() {
        let header = activm_stub::boot_info().shared_area as *const SharedHeader;
        // SAFETY: the static stacks are handed to the VMM once; nothing else uses them.
        let stacks = unsafe { &*core::ptr::addr_of!(STACKS) };
        for (i, stack) in stacks.iter().enumerate() {
            let top = stack.as_ptr() as u64 + 4096;
            // SAFETY: the shared header is mapped; the guest owns the pool's producer side.
            unsafe {
                let pool = core::ptr::addr_of!((*header).stacks) as *mut u64;
                pool.add(i).write_volatile(top);
                (*header)
                    .stack_prod
                    .0
                    .store(i as u32 + 1, Ordering::Release);
            }
        }
        let entry = new_activation as *const () as u64;
        for (what, result) in [
            ("sa_register", call(Hypercall::SaRegister, entry, 0)),
            ("sa_enable", call(Hypercall::SaEnable, 0, 0)),
        ] {
            if result != 0 {
                println!("archcheck: FAILED: {what} returned {result:#x}");
                exit(1);
            }
        }
    }

    fn preempt(vcpu: u32) -> ! {
        register_irq_handler(UPCALL_IRQ, on_upcall);
        if vcpu == 0 {
            while GO.load(Ordering::Acquire) == 0 {
                core::hint::spin_loop();
            }
            enable_upcalls();
            let setconcurrency = Hypercall::SaSetConcurrency.address(HYPERCALL_BASE);
            spin_marked(setconcurrency, 1)
        }
        GO.store(1, Ordering::Release);
        spin_marked(0, 0)
    }

    fn upcall(vcpu: u32) -> ! {
        if vcpu == 1 {
            register_irq_handler(UPCALL_IRQ, on_upcall);
            GO.store(1, Ordering::Release);
            while UPCALLS.load(Ordering::Acquire) == 0 {
                core::hint::spin_loop();
            }
            println!("archcheck: the USER upcall arrived on vCPU 1 through its SPI");
            exit(0)
        }
        while GO.load(Ordering::Acquire) == 0 {
            core::hint::spin_loop();
        }
        enable_upcalls();
        let result = call(Hypercall::SaPreempt, 1, 0);
        if result != 0 {
            println!("archcheck: FAILED: sa_preempt(1) returned {result:#x}");
            exit(1);
        }
        activm_stub::vcpu_stop()
    }

    pub fn main(vcpu: u32) -> ! {
        if args().any(|a| a == "upcall") {
            upcall(vcpu);
        }
        if args().any(|a| a == "preempt") {
            preempt(vcpu);
        }
        if vcpu != 0 {
            activm_stub::vcpu_stop();
        }
        if args().any(|a| a == "fault") {
            fault();
        }
        register_irq_handler(TIMER_IRQ, on_timer);
        register_irq_handler(RESCHEDULE_IRQ, on_sgi);
        irqchip::arm_timer_ticks(irqchip::counter_hz() / 2000);
        let mut intact = true;
        let mut rounds = 0u64;
        while TICKS.load(Ordering::Relaxed) < WANT || SGIS.load(Ordering::Relaxed) < WANT {
            if SGIS.load(Ordering::Relaxed) < WANT {
                irqchip::send_self_sgi(u32::from(RESCHEDULE_IRQ));
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
        // `halt` (wfi at EL0) sleeps until the next timer interrupt.
        let before = TICKS.load(Ordering::Relaxed);
        irqchip::arm_timer_ticks(irqchip::counter_hz() / 1000);
        while TICKS.load(Ordering::Relaxed) == before {
            activm_stub::halt();
        }
        println!("archcheck: halt woke on the timer interrupt");
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
