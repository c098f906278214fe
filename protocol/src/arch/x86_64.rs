//! x86_64: address-space constants, GDT selectors, interrupt vectors, saved contexts.

/// Lowest address a guest image may be linked at; everything below belongs to the VMM.
pub const IMAGE_BASE: u64 = 0x20_0000;
/// RAM ends below this address (the MMIO hole up to 4 GiB).
pub const RAM_LIMIT: u64 = 0xC000_0000;
/// The hypercall page ([`crate::hypercall`]): no memory behind it, mapped for CPL3.
pub const HYPERCALL_BASE: u64 = 0xFEB0_0000;
/// The local APIC (xAPIC mode), mapped for CPL3 so EOI, IPIs and the timer need no privilege.
pub const LAPIC_BASE: u64 = 0xFEE0_0000;

/// GDT selectors the VMM installs. The user pair follows the SYSRET layout.
pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const USER_DS: u16 = 0x18 | 3;
pub const USER_CS: u16 = 0x20 | 3;
/// vCPU i's TSS descriptor is at `TSS_SELECTOR_BASE + 16 * i`.
pub const TSS_SELECTOR_BASE: u16 = 0x28;

/// IDT entries with a CPU-pushed error code.
pub const fn vector_has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}
/// Vectors 0..32 are CPU exceptions.
pub const FIRST_EXTERNAL_VECTOR: u8 = 32;
/// Local APIC timer: the runtime's preemption tick (an IDT vector).
pub const TIMER_IRQ: u8 = 0x30;
/// Guest-to-guest wake-up / reschedule IPI (an IDT vector).
pub const RESCHEDULE_IRQ: u8 = 0x31;
/// The upcall interrupt the VMM sends when it has put records in a vCPU's queue (an IDT vector).
pub const UPCALL_IRQ: u8 = 0x40;
/// Spurious-interrupt vector programmed into the APIC.
pub const VECTOR_SPURIOUS: u8 = 0xFF;
/// IST slot (1-based) used for double fault, NMI and machine check.
pub const IST_CRITICAL: u8 = 1;

/// What the CPL0 stub leaves at its stack pointer when it issues `fatal_trap`:
/// the `rax` it saved, the vector and error code it pushed, then the CPU's interrupt frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TrapFrame {
    pub rax: u64,
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

/// General-purpose registers in the order a saved context stores them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Gprs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
}

/// The legacy FXSAVE image: x87, MXCSR, XMM0-15. (Our CPUs have no XSAVE.)
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct FxsaveArea(pub [u8; 512]);

impl Default for FxsaveArea {
    fn default() -> Self {
        let mut area = [0u8; 512];
        // FCW = 0x37f (x87 default), MXCSR = 0x1f80 (SSE default).
        area[0] = 0x7f;
        area[1] = 0x03;
        area[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        FxsaveArea(area)
    }
}

/// A CPL3 thread's complete state, as handed over in PREEMPTED and UNBLOCKED records.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct UserContext {
    pub gprs: Gprs,
    pub rip: u64,
    pub rflags: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub _reserved: [u64; 4],
    pub fxsave: FxsaveArea,
}

impl UserContext {
    /// The instruction pointer (`rip`).
    pub const fn pc(&self) -> u64 {
        self.rip
    }
    pub fn set_pc(&mut self, pc: u64) {
        self.rip = pc;
    }
    /// The stack pointer (`rsp`).
    pub const fn sp(&self) -> u64 {
        self.gprs.rsp
    }
    pub fn set_sp(&mut self, sp: u64) {
        self.gprs.rsp = sp;
    }
    /// The register a hypercall's result comes back in with the reference stub's load (`rax`).
    pub const fn result(&self) -> u64 {
        self.gprs.rax
    }
    pub fn set_result(&mut self, value: u64) {
        self.gprs.rax = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn user_context_layout() {
        assert_eq!(size_of::<Gprs>(), 128);
        assert_eq!(offset_of!(Gprs, rsp), 56);
        assert_eq!(offset_of!(Gprs, r15), 120);
        assert_eq!(offset_of!(UserContext, rip), 128);
        assert_eq!(offset_of!(UserContext, rflags), 136);
        assert_eq!(offset_of!(UserContext, fs_base), 144);
        assert_eq!(offset_of!(UserContext, gs_base), 152);
        assert_eq!(offset_of!(UserContext, fxsave), 192);
        assert_eq!(size_of::<UserContext>(), 704);
    }

    #[test]
    fn trap_frame_layout() {
        assert_eq!(size_of::<TrapFrame>(), 64);
        assert_eq!(offset_of!(TrapFrame, vector), 8);
        assert_eq!(offset_of!(TrapFrame, rip), 24);
        assert_eq!(offset_of!(TrapFrame, ss), 56);
    }

    #[test]
    fn address_space_is_consistent() {
        assert_eq!(USER_DS + 8, USER_CS, "SYSRET layout");
        const { assert!(RAM_LIMIT <= HYPERCALL_BASE) };
        const { assert!(HYPERCALL_BASE + crate::hypercall::HYPERCALL_PAGE_SIZE <= LAPIC_BASE) };
        assert!(vector_has_error_code(14) && !vector_has_error_code(3));
    }
}
