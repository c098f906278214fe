//! x86_64. CPL0 code lives in `global_asm!` only (boot entry in [`boot`], interrupt entry in
//! [`traps`]); no Rust code ever runs at CPL0, so the Rust code may use SSE freely.

pub(crate) mod boot;
pub(crate) mod heap;
pub(crate) mod hypercall;
pub mod irqchip;
pub mod percpu;
pub mod traps;

pub use traps::{
    arm_exception_stack, set_exception_handler, ExceptionFrame, ExceptionHandler, ExceptionInfo,
    IrqFrame,
};
pub use traps::{
    exception_stack_layout, mark_handler_holds, trap_eoi_window, user_exception_window,
    ExceptionStackLayout, UserExceptionWindow, EXCEPTION_HANDLER_HOLDS, EXCEPTION_NOT_SAVED,
    EXCEPTION_SAVED,
};

/// Reads the time-stamp counter (works at CPL3; guest and host TSC agree).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: rdtsc only reads the TSC into edx:eax.
    unsafe {
        core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// The current privilege level: the RPL bits of `%cs`. Always 3 once the stub has booted.
#[inline(always)]
pub fn current_cpl() -> u8 {
    let cs: u16;
    // SAFETY: reading %cs has no side effects.
    unsafe {
        core::arch::asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags));
    }
    (cs & 3) as u8
}

/// "CPL3": how this architecture names the unprivileged level apps run at.
pub fn current_level_name() -> &'static str {
    "CPL3"
}

/// Per-vCPU set-up at CPL3, before the heap and the layer above.
pub(crate) fn init_vcpu() {
    irqchip::enable();
}

/// Checks the architecture's part of the VMM's layout against the one this guest was built for.
pub(crate) fn check_boot_info(info: &protocol::boot::BootInfo) {
    assert!(
        info.irq_controller_base == protocol::arch::x86_64::LAPIC_BASE,
        "BootInfo local APIC {:#x} is not the ABI's {:#x}",
        info.irq_controller_base,
        protocol::arch::x86_64::LAPIC_BASE
    );
}
