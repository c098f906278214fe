//! Start-up. Every vCPU enters [`vcpu_entry`] (the stub's `__activm_vcpu_entry`, defined by
//! [`crate::main!`]). vCPU 0 sets up the runtime (per-vCPU structures, stacks, interrupt and
//! exception handlers, arguments) and creates the main thread; every vCPU then gives up its
//! boot frames and runs its scheduler on its boot stack, its first activation stack. Once every
//! vCPU is there, vCPU 0 turns on scheduler activations if the VMM offers them.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write as _;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use activm_stub::{preempt, register_irq_handler};

use crate::arch::context;
use crate::arch::cpu::{self, Word};
use crate::arch::{RESCHEDULE_IRQ, TIMER_IRQ, UPCALL_IRQ};
use crate::dispatch::{self, points};
use crate::percpu::{self, Pcpu};
use crate::tcb::{self, Tcb};
use crate::{config, fault, sched, stack, upcall};

/// The app's `main`.
pub type MainFn = fn(&[&str]) -> i32;

static READY: AtomicBool = AtomicBool::new(false);
static UP: AtomicU32 = AtomicU32::new(0);
static MAIN: AtomicPtr<Tcb> = AtomicPtr::new(core::ptr::null_mut());

/// The stub calls this on every vCPU (through `main!`).
pub fn vcpu_entry(vcpu: u32, main: MainFn) -> ! {
    // Until this vCPU runs its scheduler, interrupts must not treat it as running a thread.
    cpu::set(Word::InSched, 1);
    cpu::set(Word::Current, 0);
    if vcpu == 0 {
        init(main);
    } else {
        while !READY.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
    }
    init_vcpu(vcpu);
    UP.fetch_add(1, Ordering::AcqRel);
    if vcpu == 0 {
        while UP.load(Ordering::Acquire) < percpu::nr_vcpus() {
            core::hint::spin_loop();
        }
        upcall::enable();
        // Only now may `main` run: it sees the runtime fully set up (activations included).
        let main = MAIN.load(Ordering::Acquire);
        // SAFETY: the main thread's TCB, runnable and in no queue.
        sched::make_runnable(unsafe { tcb::from_raw(main) }, true);
    }
    // SAFETY: nothing of the boot frames is needed any more; this vCPU is in the scheduler.
    unsafe { context::abandon_to_scheduler(enter_scheduler) }
}

extern "C" fn enter_scheduler() -> ! {
    dispatch::sched_loop()
}

fn init(main: MainFn) {
    let info = activm_stub::boot_info();
    percpu::init(info);
    cpu::set(Word::Pcpu, percpu::of(0) as *const Pcpu as u64);
    stack::init();
    upcall::init();
    crate::timeline::init();
    upcall::reserve_spare_stacks();
    crate::diag::publish();

    // Arguments: the runtime's own (`--rt-*`) are consumed here.
    let args: Vec<&'static str> = activm_stub::args()
        .filter(|a| !config::apply_arg(a))
        .collect();
    let args: &'static [&'static str] = args.leak();

    sched::set_loop(dispatch::sched_loop);
    register_irq_handler(TIMER_IRQ, points::on_timer);
    register_irq_handler(RESCHEDULE_IRQ, points::on_resched);
    register_irq_handler(UPCALL_IRQ, upcall::on_upcall);
    #[cfg(feature = "sim")]
    register_irq_handler(upcall::VECTOR_SIM, points::on_sim);
    activm_stub::set_exception_handler(fault::on_exception);
    activm_stub::set_panic_context(panic_context);
    preempt::set_release_hook(points::safepoint);
    preempt::set_wait_hook(points::lock_wait);
    // SAFETY: the heap's two sequences are in the restartable-sequence table (`arch::rseq`),
    // which every handler registered above and every resumption of a handed-over context
    // consult first.
    unsafe { activm_stub::heap::use_restartable_caches() };
    crate::watchdog::set_report(crate::stats::dump);
    upcall::set_dump(crate::stats::dump);
    crate::watchdog::set_arm(crate::alarm::arm_by);

    let t = tcb::alloc(1);
    t.flags.fetch_or(tcb::FLAG_MAIN, Ordering::Relaxed);
    // SAFETY: the TCB is not visible to anyone else yet.
    unsafe { *t.name.get() = Some("main".into()) };
    // SAFETY: the TCB is fresh and not visible to anyone else yet.
    unsafe { crate::thread::init_packet(t, move || main(args)) };
    MAIN.store(t as *const Tcb as *mut Tcb, Ordering::Release);
    READY.store(true, Ordering::Release);
}

fn init_vcpu(vcpu: u32) {
    let pcpu: &'static Pcpu = percpu::of(vcpu);
    cpu::set(Word::Pcpu, pcpu as *const Pcpu as u64);
    cpu::set(Word::Armed, 0);
    cpu::set(Word::SchedIdle, 0);
    let boot_top = activm_stub::boot_info().vcpus[vcpu as usize].user_stack_top & !15;
    cpu::set(Word::SchedTop, boot_top);
    upcall::register_boot_stack(boot_top);
    upcall::init_vcpu(vcpu);
    let exc = alloc::vec![0u8; crate::exception_stack::EXCEPTION_STACK].leak();
    let exc_top = (exc.as_ptr() as u64 + crate::exception_stack::EXCEPTION_STACK as u64) & !15;
    pcpu.exception_stack.store(exc_top, Ordering::Relaxed);
    activm_stub::arm_exception_stack(exc_top);
    cpu::init_timer();
}

/// Writes "thread 'name' " (or "scheduler ") at the start of a panic message.
fn panic_context(w: &mut dyn core::fmt::Write) {
    let cur = sched::current_raw();
    if cpu::get(Word::InSched) != 0 || cur.is_null() {
        let _ = w.write_str("runtime scheduler ");
        return;
    }
    // SAFETY: the running thread's TCB.
    let t = unsafe { tcb::from_raw(cur) };
    let _ = write!(w, "thread {} ", tcb::describe(t));
}

/// A name for messages (`String` so it can outlive the thread).
pub fn thread_name_of(t: &Tcb) -> String {
    let mut s = String::new();
    let _ = write!(s, "{}", tcb::describe(t));
    s
}

/// Every thread starts here (via `__rt_thread_start`, which calls it by name), on its own stack.
///
/// # Safety
/// Called once per thread by its start frame, with its TCB.
#[unsafe(no_mangle)]
unsafe extern "C" fn __rt_thread_main(t: *const Tcb) -> ! {
    // SAFETY: `build_start_frame` passed this thread's TCB.
    let t = unsafe { tcb::from_raw(t) };
    let Some(run) = t.run.take() else {
        crate::percpu::print_trace_about(t as *const Tcb as u64);
        panic!(
            "a thread without a closure (started twice?): events {}",
            tcb::history(t)
        );
    };
    // SAFETY: the packet was set up by `thread::init_packet` with this `run`.
    unsafe { run(t) };
    crate::tls::run_destructors(t);
    if t.flag(tcb::FLAG_MAIN) {
        main_returned(t);
    }
    sched::exit_current(t)
}

/// The main thread's closure returned: the guest exits with its value.
fn main_returned(t: &Tcb) -> ! {
    // SAFETY: the main thread's packet holds its i32 result now (see `thread::init_packet`).
    let code = unsafe { *(t.packet_ptr() as *const i32) };
    if crate::config::print_stats_at_exit() {
        crate::stats::print();
    }
    activm_stub::exit(code)
}
