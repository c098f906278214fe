//! The x86_64-only modes: traps and protocol violations spelled in x86 instructions, and the
//! xAPIC interrupt tests (aarch64 has its own in `archcheck`).

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use activm_stub::protocol::arch::x86_64::{HYPERCALL_BASE, RESCHEDULE_IRQ, TIMER_IRQ};
use activm_stub::protocol::hypercall::Hypercall;
use alloc::vec::Vec;

use activm_stub::{
    boot_info, exit, lapic, nr_vcpus, pause, println, rdtsc, tsc_khz, vcpu_stop, IrqFrame,
};

/// Set by the `irq` handler.
static IRQ_SEEN: AtomicBool = AtomicBool::new(false);
/// `irq-stress`: handled timer ticks and IPIs; vCPU 0 ready; vCPU 1 done sending.
static TICKS: AtomicU64 = AtomicU64::new(0);
static IPIS: AtomicU64 = AtomicU64::new(0);
static STRESS_READY: AtomicBool = AtomicBool::new(false);
static SENDER_DONE: AtomicBool = AtomicBool::new(false);
/// `irq-stress`: rounds of `hold_registers` vCPU 0 has run, its progress as a clock: an interrupt
/// not taken while it runs on is lost, one not taken while its host thread waits for a CPU is not.
static ROUNDS: AtomicU64 = AtomicU64::new(0);

/// `mov %cr3, %rax` at CPL3: #GP, a fatal trap.
pub(crate) fn privileged() -> ! {
    // SAFETY: faults at CPL3; the stub reports the trap and the VMM stops the guest.
    unsafe { core::arch::asm!("mov rax, cr3", out("rax") _, options(nomem, nostack)) };
    panic!("mov from cr3 at CPL3 did not fault");
}

/// A load from address 0: #PF (page 0 is unmapped), a fatal trap.
pub(crate) fn null() -> ! {
    // SAFETY: faults; the stub reports the trap and the VMM stops the guest.
    unsafe {
        core::arch::asm!("xor eax, eax", "mov rax, qword ptr [rax]", out("rax") _, options(nostack))
    };
    panic!("load from address 0 did not fault");
}

/// A load at hypercall page offset 4: a protocol violation.
pub(crate) fn misaligned_hypercall() -> ! {
    // SAFETY: the VMM must stop the guest; no argument is passed.
    unsafe {
        core::arch::asm!("mov rax, qword ptr [rax]", inout("rax") HYPERCALL_BASE + 4 => _, options(nostack));
    }
    panic!("misaligned hypercall returned");
}

/// An 8-byte store to the hypercall page: a protocol violation.
pub(crate) fn store_hypercall() -> ! {
    let addr = Hypercall::ConsoleWrite.address(HYPERCALL_BASE);
    // SAFETY: the VMM must stop the guest; nothing is written to memory.
    unsafe {
        core::arch::asm!("mov qword ptr [{addr}], {value}", addr = in(reg) addr, value = in(reg) 0u64, options(nostack));
    }
    panic!("store to the hypercall page returned");
}

fn on_reschedule(_frame: &mut IrqFrame) {
    IRQ_SEEN.store(true, Ordering::Release);
}

/// A self-IPI from CPL3 through the xAPIC ICR, handled at CPL3.
pub(crate) fn irq() -> ! {
    activm_stub::register_irq_handler(RESCHEDULE_IRQ, on_reschedule);
    lapic::send_self_ipi(RESCHEDULE_IRQ);
    let deadline = rdtsc() + tsc_khz() * 1000;
    while !IRQ_SEEN.load(Ordering::Acquire) {
        assert!(rdtsc() < deadline, "self-IPI not delivered within 1 s");
        pause();
    }
    println!("irq ok");
    exit(0)
}

/// State `hold_registers` loads into and stores from the registers.
#[repr(C, align(16))]
#[derive(Debug)]
struct RegState {
    xmm_in: [[u64; 2]; 16],
    xmm_out: [[u64; 2]; 16],
    /// rax, rbx, rcx, rdx, rsi, rdi, rbp, r8..r15 after the loop.
    gpr_out: [u64; 15],
    mxcsr_out: u32,
    mxcsr_saved: u32,
}

/// The value `hold_registers` keeps in GPR number `i` (rbx = 1, rdx = 3, ...).
const fn gpr_pattern(i: u64) -> u64 {
    (0x0101_0101_0101_0101 * (i + 1)) ^ 0x8000_0000_0000_0000
}
/// MXCSR during the loop: all exceptions masked, round toward zero.
const MXCSR_HELD: u32 = 0x7F80;

/// Keeps known values in every GPR but rsp, in xmm0-15 and in MXCSR while spinning `iterations`
/// times at CPL3, then stores them: interrupts landing in the loop must not change any of them.
fn hold_registers(iterations: u64, st: &mut RegState) {
    // SAFETY: rbx and rbp are saved and restored on the stack; every other register the block
    // writes is declared; MXCSR is restored; `st` is a live, 16-byte-aligned buffer.
    unsafe {
        core::arch::asm!(
            "push rbx",
            "push rbp",
            // The caller put MXCSR_HELD in mxcsr_out.
            "stmxcsr [rax + {mxcsr_saved}]",
            "ldmxcsr [rax + {mxcsr_out}]",
            "movdqa xmm0, [rax + 0]", "movdqa xmm1, [rax + 16]", "movdqa xmm2, [rax + 32]",
            "movdqa xmm3, [rax + 48]", "movdqa xmm4, [rax + 64]", "movdqa xmm5, [rax + 80]",
            "movdqa xmm6, [rax + 96]", "movdqa xmm7, [rax + 112]", "movdqa xmm8, [rax + 128]",
            "movdqa xmm9, [rax + 144]", "movdqa xmm10, [rax + 160]", "movdqa xmm11, [rax + 176]",
            "movdqa xmm12, [rax + 192]", "movdqa xmm13, [rax + 208]", "movdqa xmm14, [rax + 224]",
            "movdqa xmm15, [rax + 240]",
            "mov rbx, {p1}", "mov rdx, {p3}", "mov rsi, {p4}", "mov rdi, {p5}", "mov rbp, {p6}",
            "mov r8, {p7}", "mov r9, {p8}", "mov r10, {p9}", "mov r11, {p10}", "mov r12, {p11}",
            "mov r13, {p12}", "mov r14, {p13}", "mov r15, {p14}",
            "2:",
            "pause",
            "dec rcx",
            "jnz 2b",
            "movdqa [rax + 256], xmm0", "movdqa [rax + 272], xmm1", "movdqa [rax + 288], xmm2",
            "movdqa [rax + 304], xmm3", "movdqa [rax + 320], xmm4", "movdqa [rax + 336], xmm5",
            "movdqa [rax + 352], xmm6", "movdqa [rax + 368], xmm7", "movdqa [rax + 384], xmm8",
            "movdqa [rax + 400], xmm9", "movdqa [rax + 416], xmm10", "movdqa [rax + 432], xmm11",
            "movdqa [rax + 448], xmm12", "movdqa [rax + 464], xmm13", "movdqa [rax + 480], xmm14",
            "movdqa [rax + 496], xmm15",
            "mov [rax + 512], rax", "mov [rax + 520], rbx", "mov [rax + 528], rcx", "mov [rax + 536], rdx",
            "mov [rax + 544], rsi", "mov [rax + 552], rdi", "mov [rax + 560], rbp", "mov [rax + 568], r8",
            "mov [rax + 576], r9", "mov [rax + 584], r10", "mov [rax + 592], r11", "mov [rax + 600], r12",
            "mov [rax + 608], r13", "mov [rax + 616], r14", "mov [rax + 624], r15",
            "stmxcsr [rax + {mxcsr_out}]",
            "ldmxcsr [rax + {mxcsr_saved}]",
            "pop rbp",
            "pop rbx",
            mxcsr_saved = const core::mem::offset_of!(RegState, mxcsr_saved),
            mxcsr_out = const core::mem::offset_of!(RegState, mxcsr_out),
            p1 = const gpr_pattern(1), p3 = const gpr_pattern(3), p4 = const gpr_pattern(4),
            p5 = const gpr_pattern(5), p6 = const gpr_pattern(6), p7 = const gpr_pattern(7),
            p8 = const gpr_pattern(8), p9 = const gpr_pattern(9), p10 = const gpr_pattern(10),
            p11 = const gpr_pattern(11), p12 = const gpr_pattern(12), p13 = const gpr_pattern(13),
            p14 = const gpr_pattern(14),
            in("rax") st as *mut RegState,
            inout("rcx") iterations => _,
            out("rdx") _, out("rsi") _, out("rdi") _, out("r8") _, out("r9") _, out("r10") _,
            out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _, out("xmm4") _, out("xmm5") _,
            out("xmm6") _, out("xmm7") _, out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
        );
    }
}

fn on_tick(frame: &mut IrqFrame) {
    assert_eq!(frame.vector, u64::from(TIMER_IRQ));
    TICKS.fetch_add(1, Ordering::Relaxed);
}

fn on_ipi(frame: &mut IrqFrame) {
    assert_eq!(frame.vector, u64::from(RESCHEDULE_IRQ));
    IPIS.fetch_add(1, Ordering::Release);
}

/// Interrupts landing at random points of CPL3 code must preserve every register: vCPU 0 holds
/// known values in all GPRs, xmm0-15 and MXCSR while its APIC timer ticks every 200 us and
/// vCPU 1 (if any) sends it 500 IPIs. Delivery is checked against vCPU 0's own progress (rounds
/// of its loop), never wall-clock time: on a loaded host a vCPU's thread may wait seconds for a
/// CPU, and the test's `--timeout` bounds the whole run.
pub(crate) fn irq_stress(vcpu: u32) -> ! {
    const WANT_TICKS: u64 = 100;
    const SEND_IPIS: u64 = 500;
    // A round is 100,000 `pause`s: ~2.4 ms of vCPU 0 running on our hosts, 0.3 ms on a CPU
    // whose `pause` takes 10 cycles. So 200 rounds are 60 ms or more of running with interrupts
    // on: an IPI takes ~0.1 ms, the VMM's interrupt watch redelivers a held one within 10 ms.
    // 2,000 rounds owe at least 3,000 timer ticks.
    const ROUNDS_PER_IPI: u64 = 200;
    const ROUNDS_FOR_TICKS: u64 = 2_000;
    match vcpu {
        0 => {}
        1 => {
            while !STRESS_READY.load(Ordering::Acquire) {
                pause();
            }
            let target = boot_info().vcpus[0].irq_id;
            for i in 0..SEND_IPIS {
                let before = IPIS.load(Ordering::Acquire);
                lapic::send_ipi(target, RESCHEDULE_IRQ);
                // After the ICR write retired (KVM set the request then): this thread may wait
                // for a CPU between any two instructions.
                let sent_at = ROUNDS.load(Ordering::Acquire);
                while IPIS.load(Ordering::Acquire) == before {
                    let ran = ROUNDS.load(Ordering::Acquire) - sent_at;
                    assert!(
                        ran < ROUNDS_PER_IPI,
                        "IPI {i} to vCPU 0 not handled while it ran {ran} rounds"
                    );
                    pause();
                }
            }
            SENDER_DONE.store(true, Ordering::Release);
            vcpu_stop()
        }
        _ => vcpu_stop(),
    }
    activm_stub::register_irq_handler(TIMER_IRQ, on_tick);
    activm_stub::register_irq_handler(RESCHEDULE_IRQ, on_ipi);
    STRESS_READY.store(true, Ordering::Release);
    lapic::start_periodic_timer(TIMER_IRQ, 200_000);
    let mut st = RegState {
        xmm_in: [[0; 2]; 16],
        xmm_out: [[0; 2]; 16],
        gpr_out: [0; 15],
        mxcsr_out: MXCSR_HELD,
        mxcsr_saved: 0,
    };
    for (i, x) in st.xmm_in.iter_mut().enumerate() {
        *x = [
            0x1111_2222_3333_4444u64.wrapping_mul(i as u64 + 1),
            !(0x0f0f_0f0f_0f0f_0f0f * (i as u64 + 1)),
        ];
    }
    let mut rounds = 0u64;
    loop {
        st.mxcsr_out = MXCSR_HELD;
        hold_registers(100_000, &mut st);
        rounds += 1;
        ROUNDS.store(rounds, Ordering::Release);
        assert_eq!(
            st.xmm_out, st.xmm_in,
            "xmm registers changed under interrupts (round {rounds})"
        );
        let rax = &st as *const RegState as u64;
        for (i, &value) in st.gpr_out.iter().enumerate() {
            let want = match i {
                0 => rax,
                2 => 0,
                _ => gpr_pattern(i as u64),
            };
            assert_eq!(
                value, want,
                "GPR #{i} changed under interrupts (round {rounds})"
            );
        }
        assert_eq!(
            st.mxcsr_out, MXCSR_HELD,
            "MXCSR changed under interrupts (round {rounds})"
        );
        let done = TICKS.load(Ordering::Relaxed) >= WANT_TICKS
            && (nr_vcpus() == 1 || SENDER_DONE.load(Ordering::Acquire));
        if done {
            break;
        }
        // vCPU 1 may wait for a host CPU as long as it likes; vCPU 0's own timer may not.
        assert!(
            rounds < ROUNDS_FOR_TICKS || TICKS.load(Ordering::Relaxed) >= WANT_TICKS,
            "irq-stress: only {} timer ticks in {rounds} rounds",
            TICKS.load(Ordering::Relaxed)
        );
    }
    lapic::stop_timer();
    let (ticks, ipis) = (TICKS.load(Ordering::Relaxed), IPIS.load(Ordering::Relaxed));
    println!("irq-stress ok: {ticks} timer ticks, {ipis} IPIs, {rounds} rounds");
    exit(0)
}

/// `ipi-latency`: the raw cost of interrupting a running vCPU, for the overcommit benchmark's
/// baseline: vCPU 0 sends 200 IPIs from CPL3 to vCPU 1, which spins at CPL3; each sample is
/// send to handler entry (TSC). Prints median and p99 in microseconds.
static IPI_AT: AtomicU64 = AtomicU64::new(0);
static IPI_COUNT: AtomicU64 = AtomicU64::new(0);
static IPI_READY: AtomicBool = AtomicBool::new(false);

fn on_latency_ipi(_frame: &mut IrqFrame) {
    IPI_AT.store(rdtsc(), Ordering::Release);
    IPI_COUNT.fetch_add(1, Ordering::AcqRel);
}

pub(crate) fn ipi_latency(vcpu: u32) -> ! {
    match vcpu {
        0 => {}
        1 => {
            activm_stub::register_irq_handler(RESCHEDULE_IRQ, on_latency_ipi);
            IPI_READY.store(true, Ordering::Release);
            loop {
                pause();
            }
        }
        _ => vcpu_stop(),
    }
    if nr_vcpus() < 2 {
        println!("ipi-latency needs 2 vCPUs");
        exit(2);
    }
    while !IPI_READY.load(Ordering::Acquire) {
        pause();
    }
    let mut samples = Vec::with_capacity(200);
    for i in 0..200u64 {
        let sent = rdtsc();
        lapic::send_ipi(1, RESCHEDULE_IRQ);
        let deadline = sent + tsc_khz() * 1000;
        while IPI_COUNT.load(Ordering::Acquire) <= i {
            if rdtsc() > deadline {
                println!("ipi-latency: IPI {i} not handled within 1 s");
                exit(1);
            }
            pause();
        }
        samples.push(IPI_AT.load(Ordering::Acquire).saturating_sub(sent));
        // Let the handler return before the next one.
        let until = rdtsc() + tsc_khz() / 10;
        while rdtsc() < until {
            pause();
        }
    }
    samples.sort_unstable();
    let us = |t: u64| t as f64 / tsc_khz() as f64 * 1000.0;
    println!(
        "ipi-latency: n=200 median={:.1} us p99={:.1} us",
        us(samples[100]),
        us(samples[197])
    );
    exit(0)
}
