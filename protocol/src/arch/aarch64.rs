//! aarch64: address-space constants and the saved context.

/// RAM starts here (the `virt` machine layout).
pub const RAM_BASE: u64 = 0x4000_0000;
/// Lowest address a guest image may be linked at.
pub const IMAGE_BASE: u64 = 0x4020_0000;
/// The hypercall page ([`crate::hypercall`]), below RAM, with no memory behind it.
pub const HYPERCALL_BASE: u64 = 0x0B00_0000;
/// GICv3 distributor and redistributors.
pub const GICD_BASE: u64 = 0x0800_0000;
pub const GICR_BASE: u64 = 0x080A_0000;
/// The upcall interrupt: a GIC software-generated interrupt (SGI) INTID. Every interrupt the
/// protocol reserves is an SGI or PPI (INTID < 32), so the type is the x86 vector's `u8`.
pub const UPCALL_IRQ: u8 = 8;
/// Guest-to-guest reschedule SGI.
pub const RESCHEDULE_IRQ: u8 = 9;
/// EL1 virtual timer PPI: the runtime's preemption tick.
pub const TIMER_IRQ: u8 = 27;

/// An EL0 thread's complete state, as handed over in PREEMPTED and UNBLOCKED records.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct UserContext {
    pub x: [u64; 31],
    pub sp: u64,
    pub pc: u64,
    pub pstate: u64,
    pub tpidr_el0: u64,
    pub fpcr: u64,
    pub fpsr: u64,
    pub _pad: u64,
    pub q: [u128; 32],
}

impl UserContext {
    /// The program counter (`pc`).
    pub const fn pc(&self) -> u64 {
        self.pc
    }
    pub fn set_pc(&mut self, pc: u64) {
        self.pc = pc;
    }
    /// The stack pointer (`sp`, i.e. SP_EL0).
    pub const fn sp(&self) -> u64 {
        self.sp
    }
    pub fn set_sp(&mut self, sp: u64) {
        self.sp = sp;
    }
    /// The register a hypercall's result comes back in with the reference stub's load (`x0`).
    pub const fn result(&self) -> u64 {
        self.x[0]
    }
    pub fn set_result(&mut self, value: u64) {
        self.x[0] = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn user_context_layout() {
        assert_eq!(offset_of!(UserContext, sp), 248);
        assert_eq!(offset_of!(UserContext, pc), 256);
        assert_eq!(offset_of!(UserContext, pstate), 264);
        assert_eq!(offset_of!(UserContext, tpidr_el0), 272);
        assert_eq!(offset_of!(UserContext, fpcr), 280);
        assert_eq!(offset_of!(UserContext, fpsr), 288);
        assert_eq!(offset_of!(UserContext, q), 304);
        assert_eq!(size_of::<UserContext>(), 832);
    }

    #[test]
    fn address_space_is_consistent() {
        const { assert!(HYPERCALL_BASE + crate::hypercall::HYPERCALL_PAGE_SIZE <= RAM_BASE) };
        const { assert!(IMAGE_BASE > RAM_BASE) };
    }
}
