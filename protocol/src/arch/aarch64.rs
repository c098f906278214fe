//! aarch64: address-space constants and the saved context.
//!
//! Under KVM the VMM chooses the guest-physical layout, so aarch64 follows x86_64: RAM from
//! guest-physical 0 (the VMM's memory code is the same on both), the interrupt controller and the
//! hypercall page in a hole below 4 GiB.

/// Lowest address a guest image may be linked at; everything below belongs to the VMM.
pub const IMAGE_BASE: u64 = 0x20_0000;
/// The 2 MiB block at `IMAGE_BASE` is mapped read-only and executable at EL0 and EL1 (EL1 may
/// not execute EL0-writable memory): the image keeps all code and read-only data in it, and its
/// writable data from here on (`IMAGE_BASE` + 2 MiB), which is mapped EL0 read-write, never
/// executable.
pub const IMAGE_DATA_BASE: u64 = IMAGE_BASE + 0x20_0000;
/// RAM ends below this address (the device hole up to 4 GiB).
pub const RAM_LIMIT: u64 = 0xC000_0000;
/// GICv3 distributor (64 KiB) and redistributors (128 KiB per vCPU, vCPU i's at
/// `GICR_BASE + i * GICR_STRIDE`), mapped EL0 read-write as device memory.
pub const GICD_BASE: u64 = 0xF000_0000;
pub const GICR_BASE: u64 = 0xF010_0000;
pub const GICR_STRIDE: u64 = 0x2_0000;
/// The hypercall page ([`crate::hypercall`]): no memory behind it, mapped for EL0 and EL1.
pub const HYPERCALL_BASE: u64 = 0xFEB0_0000;
/// The upcall interrupt of vCPU i is shared peripheral interrupt `INTID_UPCALL_BASE + i`,
/// edge-triggered and routed to vCPU i (the VMM can inject SPIs, not SGIs, and KVM keeps PPIs
/// level-triggered, where a raise-and-lower pulse can be lost).
pub const INTID_UPCALL_BASE: u32 = 32;
/// The handler number every vCPU's upcall SPI is reported under: the reference stub runs the
/// handler registered for `UPCALL_IRQ` for any INTID `INTID_UPCALL_BASE + i`.
pub const UPCALL_IRQ: u8 = INTID_UPCALL_BASE as u8;
/// Guest-to-guest reschedule SGI.
pub const RESCHEDULE_IRQ: u8 = 9;
/// EL1 virtual timer PPI: the runtime's preemption tick.
pub const TIMER_IRQ: u8 = 27;
/// INTIDs from here on are special (1023: none pending).
pub const INTID_SPECIAL: u32 = 1020;

/// What the EL1 stub leaves on the EL0 stack when it delivers an interrupt to EL0, and what the
/// `svc #0` return path reads back: the registers it needed, the interrupted PC and PSTATE,
/// the INTID and the interrupted SP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IrqFrame {
    pub x0: u64,
    pub x1: u64,
    pub pc: u64,
    pub pstate: u64,
    pub intid: u64,
    pub sp: u64,
}

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
    fn irq_frame_layout() {
        assert_eq!(size_of::<IrqFrame>(), 48);
        assert_eq!(offset_of!(IrqFrame, pc), 16);
        assert_eq!(offset_of!(IrqFrame, intid), 32);
        assert_eq!(offset_of!(IrqFrame, sp), 40);
    }

    #[test]
    fn address_space_is_consistent() {
        const { assert!(RAM_LIMIT <= GICD_BASE) };
        const { assert!(GICD_BASE + 0x1_0000 <= GICR_BASE) };
        const {
            assert!(
                GICR_BASE + crate::MAX_VCPUS as u64 * GICR_STRIDE <= HYPERCALL_BASE,
                "every redistributor fits below the hypercall page"
            )
        };
        const { assert!(IMAGE_BASE.is_multiple_of(0x20_0000)) };
    }
}
