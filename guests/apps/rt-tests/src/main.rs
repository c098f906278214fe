#![no_std]
#![no_main]
use core::sync::atomic::{AtomicU64, Ordering};
use activm_stub::protocol::arch::x86_64::*;
use activm_stub::{exit, lapic, println, rdtsc, vcpu_stop, IrqFrame, tsc_khz, hypercall};

static HITS: AtomicU64 = AtomicU64::new(0);
static LAST: AtomicU64 = AtomicU64::new(0);
fn on_irq(_f: &mut IrqFrame) { LAST.store(rdtsc(), Ordering::Relaxed); HITS.fetch_add(1, Ordering::Release); }

fn wr(reg: u64, v: u32) { unsafe { core::ptr::write_volatile((LAPIC_BASE + reg) as *mut u32, v) } }
fn rd(reg: u64) -> u32 { unsafe { core::ptr::read_volatile((LAPIC_BASE + reg) as *const u32) } }

fn main(vcpu: u32) -> ! {
    if vcpu != 0 { vcpu_stop(); }
    let khz = tsc_khz();
    let ns = |c: u64| c * 1_000_000 / khz;
    activm_stub::register_irq_handler(VECTOR_TIMER, on_irq);
    activm_stub::register_irq_handler(VECTOR_RESCHEDULE, on_irq);
    // TMICT write (one-shot, far future) cost
    wr(0x3E0, 0b1011);
    wr(0x320, u32::from(VECTOR_TIMER));
    let n = 2000;
    let t0 = rdtsc();
    for _ in 0..n { wr(0x380, 1_000_000_000); }
    let t1 = rdtsc();
    println!("TMICT write: {} ns", ns((t1 - t0) / n));
    wr(0x380, 0);
    let t0 = rdtsc();
    for _ in 0..n { let _ = rd(0x390); }
    let t1 = rdtsc();
    println!("TMCCT read: {} ns", ns((t1 - t0) / n));
    let t0 = rdtsc();
    for _ in 0..n { wr(0x80, 0); }
    let t1 = rdtsc();
    println!("TPR write: {} ns", ns((t1 - t0) / n));
    let t0 = rdtsc();
    for _ in 0..n { let _ = rd(0x20); }
    let t1 = rdtsc();
    println!("APIC ID read: {} ns", ns((t1 - t0) / n));
    // self IPI round trip
    let n = 500;
    let t0 = rdtsc();
    for i in 0..n { lapic::send_self_ipi(VECTOR_RESCHEDULE); while HITS.load(Ordering::Acquire) <= i { core::hint::spin_loop(); } }
    let t1 = rdtsc();
    println!("self IPI round trip: {} ns", ns((t1 - t0) / n));
    // send cost only
    HITS.store(0, Ordering::Relaxed);
    let t0 = rdtsc();
    lapic::send_self_ipi(VECTOR_RESCHEDULE);
    let t1 = rdtsc();
    while HITS.load(Ordering::Acquire) == 0 {}
    let t2 = LAST.load(Ordering::Relaxed);
    println!("self IPI send {} ns, to handler {} ns", ns(t1 - t0), ns(t2 - t0));
    // one-shot timer latency for various periods
    for period in [20_000u32, 50_000, 100_000, 1_000_000] {
        let mut worst = 0; let mut sum = 0;
        for _ in 0..50 {
            HITS.store(0, Ordering::Relaxed);
            let t0 = rdtsc();
            wr(0x380, period);
            while HITS.load(Ordering::Acquire) == 0 { core::hint::spin_loop(); }
            let d = ns(LAST.load(Ordering::Relaxed) - t0);
            worst = worst.max(d); sum += d;
        }
        println!("one-shot {} ns: avg {} ns worst {} ns", period, sum / 50, worst);
    }
    // halt with timer
    for period in [50_000u32, 200_000, 1_000_000] {
        let mut sum = 0;
        for _ in 0..20 {
            HITS.store(0, Ordering::Relaxed);
            let t0 = rdtsc();
            wr(0x380, period);
            activm_stub::halt();
            let t1 = rdtsc();
            while HITS.load(Ordering::Acquire) == 0 { core::hint::spin_loop(); }
            sum += ns(t1 - t0);
        }
        println!("halt with one-shot {} ns: woke after avg {} ns", period, sum / 20);
    }
    let n = 200;
    let t0 = rdtsc();
    for _ in 0..n { hypercall::console_write(b""); }
    let t1 = rdtsc();
    println!("console_write(0) hypercall: {} ns", ns((t1 - t0) / n));
    exit(0)
}
activm_stub::vcpu_entry!(main);
