//! `selftest sa`: the VMM's side of scheduler activations end to end, at stub level (no
//! runtime). Run with `--vcpus 2 --pcpus 2`.
//!
//! Both vCPUs run `worker`. vCPU 0 sets the concurrency to 1, so the allocator takes one vCPU's
//! processor: its context arrives in a PREEMPTED record on the other vCPU, whose upcall handler
//! keeps it. That worker sets the concurrency back to 2: the parked vCPU starts a new activation
//! at `upcall_entry` (NEWPROC), which resumes the preempted context, registers and FP state
//! included. The resumed worker notices its activation changed and reports; the other worker
//! then interrupts it with `sa_preempt` (a USER upcall) and the guest exits 0 if every record
//! arrived once, in sequence, with sane contents.

use alloc::vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(target_arch = "aarch64")]
use activm_stub::protocol::arch::aarch64::{IrqFrame as StubFrame, UserContext, UPCALL_IRQ};
#[cfg(target_arch = "x86_64")]
use activm_stub::protocol::arch::x86_64::{UserContext, UPCALL_IRQ};
use activm_stub::protocol::hypercall::{Hypercall, HC_UNSUPPORTED};
use activm_stub::protocol::shared::{
    SharedHeader, UpcallKind, UpcallRecord, VcpuArea, RECORD_HAS_CONTEXT, STACK_POOL_CAPACITY,
    UPCALL_QUEUE_CAPACITY,
};
use activm_stub::{boot_info, exit, hypercall, pause, println, rdtsc, tsc_khz, vcpu_id, IrqFrame};

static READY: AtomicBool = AtomicBool::new(false);
static WORKERS: AtomicU32 = AtomicU32::new(0);
static LOWERED: AtomicBool = AtomicBool::new(false);
static RAISED: AtomicBool = AtomicBool::new(false);
static PREEMPTED: AtomicU32 = AtomicU32::new(0);
static NEWPROC: AtomicU32 = AtomicU32::new(0);
static USER: AtomicU32 = AtomicU32::new(0);
static SIGNAL: AtomicU64 = AtomicU64::new(0);
static RESUMED_ON: AtomicU32 = AtomicU32::new(u32::MAX);
static LAST_SEQ: AtomicU64 = AtomicU64::new(0);
static BAD: AtomicU32 = AtomicU32::new(0);
/// Upcall latency of the PREEMPTED record: event to handler, in TSC ticks.
static LATENCY: AtomicU64 = AtomicU64::new(0);

/// The preempted context, from the PREEMPTED record until a new activation resumes it.
// SAFETY: UserContext is integers only, so all-zero bytes are a valid value.
static mut SAVED: UserContext = unsafe { core::mem::zeroed() };
static SAVED_READY: AtomicBool = AtomicBool::new(false);

fn call(nr: Hypercall, a0: u64) -> u64 {
    // SAFETY: the sa_* calls take plain numbers or the address of a function of this image.
    unsafe { hypercall::raw(nr as u64, a0, 0, 0, 0) }
}

fn shared() -> u64 {
    boot_info().shared_area
}

fn area(vcpu: u32) -> *mut VcpuArea {
    (shared() + 4096 + vcpu as u64 * 16384) as *mut VcpuArea
}

fn header() -> *mut SharedHeader {
    shared() as *mut SharedHeader
}

fn check(ok: bool, what: &str) {
    if !ok {
        BAD.fetch_add(1, Ordering::Relaxed);
        println!("sa: check failed: {what}");
    }
}

/// Read this vCPU's upcall queue in order.
fn drain(expected_activation: Option<u32>) {
    let vcpu = vcpu_id();
    // SAFETY: the area is this vCPU's part of the shared area; only this vCPU consumes it.
    let area = unsafe { &*area(vcpu) };
    let head = area.queue_head.load(Ordering::Acquire);
    let mut tail = area.queue_tail.load(Ordering::Relaxed);
    while tail != head {
        let record: &UpcallRecord = &area.records[tail as usize % UPCALL_QUEUE_CAPACITY];
        let seq = record.seq;
        let last = LAST_SEQ.fetch_max(seq, Ordering::AcqRel);
        check(seq == last + 1, "sequence numbers increase by one");
        match UpcallKind::from_raw(record.kind) {
            Some(UpcallKind::Preempted) => {
                check(
                    record.flags & RECORD_HAS_CONTEXT != 0,
                    "PREEMPTED carries a context",
                );
                check(record.vcpu != vcpu, "PREEMPTED arrives on another vCPU");
                let stack_top = boot_info().vcpus[record.vcpu as usize].user_stack_top;
                let sp = record.context.sp();
                check(
                    sp < stack_top && sp > stack_top - 256 * 1024,
                    "preempted stack pointer is on its boot stack",
                );
                check(
                    interrupts_on(&record.context),
                    "preempted with interrupts on",
                );
                LATENCY.store(rdtsc().saturating_sub(record.tsc), Ordering::Relaxed);
                // SAFETY: only this handler writes SAVED, once, before publishing it.
                unsafe { core::ptr::addr_of_mut!(SAVED).write(record.context) };
                SAVED_READY.store(true, Ordering::Release);
                PREEMPTED.fetch_add(1, Ordering::AcqRel);
            }
            Some(UpcallKind::NewProc) => {
                // The new activation took a stack from the pool: put a fresh one back.
                push_stack();
                check(
                    Some(record.activation) == expected_activation,
                    "NEWPROC names the new activation",
                );
                check(record.vcpu == vcpu, "NEWPROC is for this vCPU");
                NEWPROC.fetch_add(1, Ordering::AcqRel);
            }
            Some(UpcallKind::User) => {
                check(record.vcpu == vcpu, "USER is for this vCPU");
                USER.fetch_add(1, Ordering::AcqRel);
            }
            Some(UpcallKind::Signal) => SIGNAL.store(record.arg, Ordering::Release),
            other => check(
                false,
                if other.is_none() {
                    "a known record kind"
                } else {
                    "no unexpected upcall"
                },
            ),
        }
        tail = tail.wrapping_add(1);
    }
    area.queue_tail.store(tail, Ordering::Release);
}

fn on_upcall(_frame: &mut IrqFrame) {
    drain(None);
}

/// Where a new activation starts (NEWPROC), on a stack from the pool.
extern "C" fn upcall_entry(vcpu: u64, activation: u64) -> ! {
    check(vcpu == vcpu_id() as u64, "new activation on its own vCPU");
    drain(Some(activation as u32));
    let deadline = rdtsc() + tsc_khz() * 2000;
    while !SAVED_READY.load(Ordering::Acquire) {
        if rdtsc() > deadline {
            println!("sa: new activation found no preempted context to resume");
            exit(1);
        }
        pause();
    }
    // SAFETY: SAVED was published by the PREEMPTED handler and is not written again.
    unsafe { resume(core::ptr::addr_of!(SAVED)) }
}

/// Whether `context` was taken with interrupts enabled (RFLAGS.IF).
#[cfg(target_arch = "x86_64")]
fn interrupts_on(context: &UserContext) -> bool {
    context.rflags & 0x200 != 0
}

/// Whether `context` was taken with interrupts enabled (PSTATE.I clear).
#[cfg(target_arch = "aarch64")]
fn interrupts_on(context: &UserContext) -> bool {
    context.pstate & 0x80 == 0
}

/// Resume a saved user context: FP state, every register, flags, stack and instruction pointer.
///
/// # Safety
/// `context` is a context the VMM took from this guest at CPL3; its stack is not in use.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn resume(context: *const UserContext) -> ! {
    // SAFETY: the caller guarantees the context; the offsets are UserContext's (pinned by the
    // protocol's layout tests): gprs at 0 in rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp, r8..r15
    // order, rip at 128, rflags at 136, the FXSAVE image at 192. The 16 bytes written below the
    // context's rsp are free (no red zone).
    unsafe {
        core::arch::asm!(
            "fxrstor [rdi + 192]",
            "mov rax, [rdi + 56]",
            "sub rax, 16",
            "mov rcx, [rdi + 128]",
            "mov [rax + 8], rcx",
            "mov rcx, [rdi + 136]",
            "mov [rax], rcx",
            "mov rsp, rax",
            "mov rax, [rdi + 0]",
            "mov rbx, [rdi + 8]",
            "mov rcx, [rdi + 16]",
            "mov rdx, [rdi + 24]",
            "mov rsi, [rdi + 32]",
            "mov rbp, [rdi + 48]",
            "mov r8, [rdi + 64]",
            "mov r9, [rdi + 72]",
            "mov r10, [rdi + 80]",
            "mov r11, [rdi + 88]",
            "mov r12, [rdi + 96]",
            "mov r13, [rdi + 104]",
            "mov r14, [rdi + 112]",
            "mov r15, [rdi + 120]",
            "mov rdi, [rdi + 40]",
            "popfq",
            "ret",
            in("rdi") context,
            options(noreturn),
        )
    }
}

/// Resume a saved user context: FP/SIMD state, TPIDR_EL0, every register, NZCV, stack and
/// program counter. An `IrqFrame` (x0, x1, pc, pstate, sp) is written just below the context's
/// stack pointer (AAPCS64 has no red zone: nothing lives there) and the stub's `svc #0` return
/// path reloads pc, NZCV, sp, x0 and x1 from it.
///
/// # Safety
/// `context` is a context the VMM took from this guest at EL0; its stack is not in use.
#[cfg(target_arch = "aarch64")]
unsafe extern "C" fn resume(context: *const UserContext) -> ! {
    use core::mem::{offset_of, size_of};
    // SAFETY: the caller guarantees the context; the offsets are UserContext's and the stub's
    // IrqFrame's. x0 holds the context until the `svc #0`, which reloads x0 and x1.
    unsafe {
        core::arch::asm!(
            "ldr x1, [x0, {ctx_sp}]",
            "sub x1, x1, {frame}",
            "and x1, x1, #~15",
            "ldr x2, [x0, {ctx_x}]",
            "ldr x3, [x0, {ctx_x} + 8]",
            "stp x2, x3, [x1, {fr_x0}]",
            "ldr x2, [x0, {ctx_pc}]",
            "str x2, [x1, {fr_pc}]",
            "ldr x2, [x0, {ctx_pstate}]",
            "str x2, [x1, {fr_pstate}]",
            "ldr x2, [x0, {ctx_sp}]",
            "str x2, [x1, {fr_sp}]",
            "mov sp, x1",
            "ldr x2, [x0, {ctx_tpidr}]",
            "msr tpidr_el0, x2",
            "ldr x2, [x0, {ctx_fpcr}]",
            "msr fpcr, x2",
            "ldr x2, [x0, {ctx_fpsr}]",
            "msr fpsr, x2",
            "add x9, x0, {ctx_q}",
            "ldp q0, q1, [x9, #0]",
            "ldp q2, q3, [x9, #32]",
            "ldp q4, q5, [x9, #64]",
            "ldp q6, q7, [x9, #96]",
            "ldp q8, q9, [x9, #128]",
            "ldp q10, q11, [x9, #160]",
            "ldp q12, q13, [x9, #192]",
            "ldp q14, q15, [x9, #224]",
            "ldp q16, q17, [x9, #256]",
            "ldp q18, q19, [x9, #288]",
            "ldp q20, q21, [x9, #320]",
            "ldp q22, q23, [x9, #352]",
            "ldp q24, q25, [x9, #384]",
            "ldp q26, q27, [x9, #416]",
            "ldp q28, q29, [x9, #448]",
            "ldp q30, q31, [x9, #480]",
            "ldp x2, x3, [x0, {ctx_x} + 16]",
            "ldp x4, x5, [x0, {ctx_x} + 32]",
            "ldp x6, x7, [x0, {ctx_x} + 48]",
            "ldp x8, x9, [x0, {ctx_x} + 64]",
            "ldp x10, x11, [x0, {ctx_x} + 80]",
            "ldp x12, x13, [x0, {ctx_x} + 96]",
            "ldp x14, x15, [x0, {ctx_x} + 112]",
            "ldp x16, x17, [x0, {ctx_x} + 128]",
            "ldp x18, x19, [x0, {ctx_x} + 144]",
            "ldp x20, x21, [x0, {ctx_x} + 160]",
            "ldp x22, x23, [x0, {ctx_x} + 176]",
            "ldp x24, x25, [x0, {ctx_x} + 192]",
            "ldp x26, x27, [x0, {ctx_x} + 208]",
            "ldp x28, x29, [x0, {ctx_x} + 224]",
            "ldr x30, [x0, {ctx_x} + 240]",
            "svc #0",
            in("x0") context,
            ctx_x = const offset_of!(UserContext, x),
            ctx_sp = const offset_of!(UserContext, sp),
            ctx_pc = const offset_of!(UserContext, pc),
            ctx_pstate = const offset_of!(UserContext, pstate),
            ctx_tpidr = const offset_of!(UserContext, tpidr_el0),
            ctx_fpcr = const offset_of!(UserContext, fpcr),
            ctx_fpsr = const offset_of!(UserContext, fpsr),
            ctx_q = const offset_of!(UserContext, q),
            frame = const size_of::<StubFrame>(),
            fr_x0 = const offset_of!(StubFrame, x0),
            fr_pc = const offset_of!(StubFrame, pc),
            fr_pstate = const offset_of!(StubFrame, pstate),
            fr_sp = const offset_of!(StubFrame, sp),
            options(noreturn),
        )
    }
}

/// Spins, and drives the test from whichever vCPU keeps running.
#[inline(never)]
fn worker(vcpu: u32) -> ! {
    // SAFETY: this vCPU's area; `activation` is written by the VMM.
    let my_activation = unsafe { &*area(vcpu) }.activation.load(Ordering::Acquire);
    WORKERS.fetch_add(1, Ordering::AcqRel);
    // FP state that must survive the hand-off.
    let mut x = 1.0f64 + vcpu as f64;
    let deadline = rdtsc() + tsc_khz() * 20_000;
    loop {
        x = core::hint::black_box(x * 1.000_000_1);
        let now_vcpu = vcpu_id();
        // SAFETY: as above.
        let activation = unsafe { &*area(now_vcpu) }
            .activation
            .load(Ordering::Acquire);
        if activation != my_activation && RESUMED_ON.load(Ordering::Acquire) == u32::MAX {
            check(x > 1.0 + vcpu as f64, "FP state survived");
            println!("sa: worker of activation {my_activation} resumed on activation {activation} (vCPU {now_vcpu})");
            RESUMED_ON.store(now_vcpu, Ordering::Release);
        }
        if vcpu_id() == 0
            && WORKERS.load(Ordering::Acquire) >= 2
            && !LOWERED.swap(true, Ordering::AcqRel)
        {
            let previous = call(Hypercall::SaSetConcurrency, 1);
            check(
                previous == 2,
                "sa_setconcurrency returns the previous value",
            );
        }
        if PREEMPTED.load(Ordering::Acquire) == 1 && !RAISED.swap(true, Ordering::AcqRel) {
            call(Hypercall::SaSetConcurrency, 2);
        }
        let resumed_on = RESUMED_ON.load(Ordering::Acquire);
        if resumed_on != u32::MAX && resumed_on != vcpu_id() && USER.load(Ordering::Acquire) == 0 {
            // Interrupt the resumed worker's vCPU with a USER upcall, once.
            if call(Hypercall::SaPreempt, resumed_on as u64) == 0 {
                let until = rdtsc() + tsc_khz() * 1000;
                while USER.load(Ordering::Acquire) == 0 && rdtsc() < until {
                    pause();
                }
                finish();
            }
        }
        if rdtsc() > deadline {
            println!(
                "sa: timed out: preempted={} newproc={} user={} resumed_on={}",
                PREEMPTED.load(Ordering::Relaxed),
                NEWPROC.load(Ordering::Relaxed),
                USER.load(Ordering::Relaxed),
                RESUMED_ON.load(Ordering::Relaxed) as i64
            );
            exit(1);
        }
    }
}

fn finish() -> ! {
    let latency_us = LATENCY.load(Ordering::Relaxed) * 1000 / tsc_khz().max(1);
    let (p, n, u) = (
        PREEMPTED.load(Ordering::Relaxed),
        NEWPROC.load(Ordering::Relaxed),
        USER.load(Ordering::Relaxed),
    );
    println!(
        "sa: preempted={p} newproc={n} user={u} last_seq={} bad={}",
        LAST_SEQ.load(Ordering::Relaxed),
        BAD.load(Ordering::Relaxed)
    );
    println!("sa: PREEMPTED upcall latency_us={latency_us} (kick to handler)");
    let ok = p == 1 && n == 1 && u == 1 && BAD.load(Ordering::Relaxed) == 0;
    println!("{}", if ok { "sa ok" } else { "sa FAILED" });
    exit(if ok { 0 } else { 1 })
}

/// Put a fresh 16 KiB upcall stack (from the heap, never freed) into the pool.
fn push_stack() {
    // SAFETY: the header is the shared area's first page; the guest produces the pool, and
    // only one vCPU at a time runs this (the NEWPROC handler of a new activation, or `enable`).
    let header = unsafe { &mut *header() };
    let stack = vec![0u8; 16384].leak();
    let top = (stack.as_ptr() as u64 + stack.len() as u64) & !15;
    let prod = header.stack_prod.0.load(Ordering::Relaxed);
    header.stacks[prod as usize % STACK_POOL_CAPACITY] = top;
    header
        .stack_prod
        .0
        .store(prod.wrapping_add(1), Ordering::Release);
}

/// Register the upcall entry, fill the stack pool, enable upcalls.
fn enable() {
    activm_stub::register_irq_handler(UPCALL_IRQ, on_upcall);
    for _ in 0..8 {
        push_stack();
    }
    if call(Hypercall::SaRegister, upcall_entry as *const () as u64) == HC_UNSUPPORTED
        || call(Hypercall::SaEnable, 0) == HC_UNSUPPORTED
    {
        println!("sa: activations unsupported (--no-activations?)");
        exit(3);
    }
}

/// `selftest sa-signal`: wait for the SIGNAL upcall of a host SIGINT/SIGTERM, then exit 0.
pub fn signal(vcpu: u32) -> ! {
    if vcpu != 0 {
        activm_stub::vcpu_stop();
    }
    enable();
    println!("sa-signal: waiting");
    loop {
        let signal = SIGNAL.load(Ordering::Acquire);
        if signal != 0 {
            println!("sa-signal: got signal {signal}, shutting down cleanly");
            exit(0);
        }
        pause();
    }
}

/// `selftest sa-hostile`: enable upcalls, then scribble over the queue indices and the stack
/// pool and give up a processor, so the VMM has to deliver into a corrupt shared area.
pub fn hostile(vcpu: u32) -> ! {
    if vcpu == 0 {
        enable();
        for v in 0..boot_info().nr_vcpus {
            // SAFETY: the guest owns its shared area; corrupting it is the point of this mode.
            unsafe { &*area(v) }
                .queue_tail
                .store(0xdead_beef, Ordering::Release);
        }
        // SAFETY: as above.
        let header = unsafe { &mut *header() };
        header.stack_prod.0.store(0x7fff_ffff, Ordering::Release);
        header.stacks.fill(0x1234_5671);
        READY.store(true, Ordering::Release);
        call(Hypercall::SaSetConcurrency, 1);
    } else {
        while !READY.load(Ordering::Acquire) {
            pause();
        }
    }
    loop {
        pause();
    }
}

/// Where new activations of `sa-spin` go: drain the queue, then spin with the others.
extern "C" fn spin_entry(_vcpu: u64, activation: u64) -> ! {
    drain(Some(activation as u32));
    spin_forever()
}

/// TSC at which `sa-spin` ends (0: never).
static SPIN_UNTIL: AtomicU64 = AtomicU64::new(0);

fn spin_forever() -> ! {
    loop {
        let until = SPIN_UNTIL.load(Ordering::Acquire);
        if until != 0 && rdtsc() > until {
            println!("sa-spin: done");
            exit(0);
        }
        pause();
    }
}

/// `selftest sa-spin [SECONDS]`: every vCPU takes upcalls and spins (then exits 0 after
/// SECONDS, if given); preempted contexts are dropped and new activations just spin. For
/// `activm ctl` add/remove tests and measurements.
pub fn spin(vcpu: u32, seconds: Option<u64>) -> ! {
    if vcpu == 0 {
        if let Some(seconds) = seconds {
            SPIN_UNTIL.store(rdtsc() + seconds * 1000 * tsc_khz(), Ordering::Release);
        }
        enable();
        call(Hypercall::SaRegister, spin_entry as *const () as u64);
        println!("sa-spin: ready");
        READY.store(true, Ordering::Release);
    } else {
        while !READY.load(Ordering::Acquire) {
            pause();
        }
    }
    spin_forever()
}

/// `selftest sa-defer`: every vCPU asks the VMM to defer preemptions; vCPU 0 lowers the
/// concurrency, the VMM raises `preempt_pending` on the victim instead of preempting it at once,
/// and the victim gives its processor back with `sa_yield`: no PREEMPTED record may arrive.
/// Exit 3 if one does all the same: the victim's host thread did not run within the grace.
pub fn defer(vcpu: u32) -> ! {
    // SAFETY: this vCPU's own area; the guest writes `defer_preemption`.
    let me = unsafe { &*area(vcpu) };
    me.defer_preemption.0.store(1, Ordering::Release);
    if vcpu == 0 {
        enable();
        READY.store(true, Ordering::Release);
    } else {
        while !READY.load(Ordering::Acquire) {
            pause();
        }
    }
    WORKERS.fetch_add(1, Ordering::AcqRel);
    let deadline = rdtsc() + tsc_khz() * 10_000;
    loop {
        if me.preempt_pending.0.load(Ordering::Acquire) != 0 {
            // Asked to give the processor back: do it at this safe point.
            call(Hypercall::SaYield, 0);
        }
        if vcpu_id() == 0
            && WORKERS.load(Ordering::Acquire) >= 2
            && !LOWERED.swap(true, Ordering::AcqRel)
        {
            call(Hypercall::SaSetConcurrency, 1);
        }
        if PREEMPTED.load(Ordering::Acquire) != 0 {
            // The host did not run the victim within the VMM's grace (a loaded machine): the
            // VMM took the processor as it must. Say so apart from a failure.
            println!("sa-defer: the grace ran out before the victim yielded (preempted)");
            let code = if BAD.load(Ordering::Relaxed) == 0 {
                3
            } else {
                1
            };
            exit(code);
        }
        if LOWERED.load(Ordering::Acquire) {
            let other = 1 - vcpu_id().min(1);
            // SAFETY: the other vCPU's area, written by the VMM.
            let state = unsafe { &*area(other) }.state.0.load(Ordering::Acquire);
            if state == 0 {
                let ok = PREEMPTED.load(Ordering::Acquire) == 0 && BAD.load(Ordering::Relaxed) == 0;
                println!(
                    "sa-defer: vCPU {other} yielded after preempt_pending; PREEMPTED records: {}",
                    PREEMPTED.load(Ordering::Relaxed)
                );
                println!("{}", if ok { "sa-defer ok" } else { "sa-defer FAILED" });
                exit(if ok { 0 } else { 1 });
            }
        }
        if rdtsc() > deadline {
            println!("sa-defer: timed out");
            exit(1);
        }
    }
}

pub fn run(vcpu: u32) -> ! {
    if vcpu == 0 {
        enable();
        READY.store(true, Ordering::Release);
    } else {
        while !READY.load(Ordering::Acquire) {
            pause();
        }
    }
    worker(vcpu)
}
