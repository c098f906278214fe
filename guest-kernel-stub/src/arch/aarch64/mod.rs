//! aarch64. EL1 code lives in `global_asm!` only (boot entry in [`boot`], exception vectors in
//! [`traps`]), a handful of instructions per exception; everything else runs at EL0.
//!
//! The VMM builds the page tables and sets the translation, FP/SIMD access and timer access
//! controls before the first instruction (docs/protocol.md, section 3), so `_start` only records
//! the counter, enables the GIC CPU interface, points TPIDRRO_EL0 at the vCPU's block and `eret`s
//! to EL0.

pub(crate) mod boot;
pub(crate) mod heap;
pub(crate) mod hypercall;
pub mod irqchip;
pub mod percpu;
pub mod traps;

pub use traps::{
    arm_exception_stack, set_exception_handler, trap_eoi_window, ExceptionFrame, ExceptionHandler,
    ExceptionInfo, IrqFrame,
};

/// Reads the virtual counter (CNTVCT_EL0, readable at EL0: CNTKCTL_EL1.EL0VCTEN). It plays the
/// part of x86's TSC; `BootInfo::tsc_khz` is its frequency.
#[inline(always)]
pub fn rdtsc() -> u64 {
    let value: u64;
    // SAFETY: reading CNTVCT_EL0 has no side effects; the `isb` orders it after earlier code.
    unsafe {
        core::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) value, options(nomem, nostack, preserves_flags));
    }
    value
}

/// The current exception level (CurrentEL is not readable at EL0, where the stub always runs
/// after boot, so a read that works means EL1). Always 0 once the stub has booted.
#[inline(always)]
pub fn current_cpl() -> u8 {
    0
}

/// "EL0": how this architecture names the unprivileged level apps run at.
pub fn current_level_name() -> &'static str {
    "EL0"
}

/// Per-vCPU set-up at EL0, before the heap and the layer above.
pub(crate) fn init_vcpu() {
    irqchip::enable();
}

/// Checks the architecture's part of the VMM's layout against the one this guest was built for.
pub(crate) fn check_boot_info(info: &protocol::boot::BootInfo) {
    assert!(
        info.irq_controller_base == protocol::arch::aarch64::GICD_BASE,
        "BootInfo GIC distributor {:#x} is not the ABI's {:#x}",
        info.irq_controller_base,
        protocol::arch::aarch64::GICD_BASE
    );
}
