//! activm-stub: the bottom of every activm guest.
//!
//! * The only code that runs at CPL0 (x86_64): the boot entry `_start` and the 256 interrupt entry
//!   stubs, all hand-written assembly without SSE (the CPL0 emulator of our KVM has none). They
//!   drop to CPL3 at once and deliver interrupts to CPL3 signal-style.
//! * The CPL3 side: boot checks, per-vCPU block (`%gs`), heap, console, hypercalls, interrupt
//!   and CPU-exception handler registration, preemption holds and a spinlock for the layer
//!   above, panic handler.
//!
//! The layer above (an app, later the runtime) supplies the per-vCPU entry with [`vcpu_entry!`].
#![no_std]

pub mod arch;
pub mod console;
pub mod cpu_local;
pub mod heap;
pub mod hypercall;
pub mod irq;
mod panic;
pub mod preempt;
mod start;
pub mod sync;

pub use protocol;

#[cfg(target_arch = "x86_64")]
pub use arch::current::irqchip as lapic;
pub use arch::current::percpu::vcpu_id;
pub use arch::current::{
    arm_exception_stack, set_exception_handler, trap_eoi_window, ExceptionFrame, ExceptionHandler,
    ExceptionInfo,
};
pub use arch::current::{current_cpl, current_level_name, rdtsc};
pub use hypercall::{exit, halt, vcpu_stop};
pub use irq::{register_irq_handler, unregister_irq_handler, IrqFrame, IrqHandler};
pub use panic::set_panic_context;
pub use start::{args, boot_info, env, nr_vcpus, take_entropy_seed, tsc_khz, Args};

/// Spin-wait hint (`pause` on x86_64). Waiting at CPL3 costs nothing extra; never spin at CPL0.
#[inline(always)]
pub fn pause() {
    core::hint::spin_loop();
}

/// Defines the per-vCPU entry the stub calls once the vCPU is up (at CPL3, heap ready):
/// `activm_stub::vcpu_entry!(main);` with `fn main(vcpu: u32) -> !`. Every vCPU calls it.
#[macro_export]
macro_rules! vcpu_entry {
    ($entry:path) => {
        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub fn __activm_vcpu_entry(vcpu: u32) -> ! {
            let entry: fn(u32) -> ! = $entry;
            entry(vcpu)
        }
    };
}
