//! x86_64 register state that must survive preemption: all GPRs but rsp, xmm0-15, MXCSR and the
//! arithmetic flags are loaded with known values, held through a spin loop that changes none of
//! them (`lea` + `jrcxz` do not touch the flags), then stored and compared.

/// The state `hold` loads and stores (offsets are used by the assembly).
#[repr(C, align(16))]
#[derive(Debug)]
pub struct RegState {
    pub xmm_in: [[u64; 2]; 16],
    pub xmm_out: [[u64; 2]; 16],
    /// By register number: rax 0, rbx 1, rcx 2, rdx 3, rsi 4, rdi 5, rbp 6, (rsp 7), r8..r15.
    pub gpr_in: [u64; 16],
    pub gpr_out: [u64; 16],
    pub mxcsr_in: u32,
    pub mxcsr_out: u32,
    pub mxcsr_saved: u32,
    pub _pad: u32,
    pub flags_out: u64,
}

const _: () = {
    assert!(core::mem::offset_of!(RegState, xmm_out) == 256);
    assert!(core::mem::offset_of!(RegState, gpr_in) == 512);
    assert!(core::mem::offset_of!(RegState, gpr_out) == 640);
    assert!(core::mem::offset_of!(RegState, mxcsr_in) == 768);
    assert!(core::mem::offset_of!(RegState, mxcsr_out) == 772);
    assert!(core::mem::offset_of!(RegState, mxcsr_saved) == 776);
    assert!(core::mem::offset_of!(RegState, flags_out) == 784);
};

/// Spins per `hold` in `fp-preemption` (long enough for 50 preemptions).
pub const HOLD_SPINS: u64 = 50_000;

/// CF, PF, AF, SF and OF set, ZF clear (plus the always-one bit 1).
pub const FLAGS_HELD: u64 = 0x895 | 0x2;
/// The arithmetic flags.
pub const FLAGS_MASK: u64 = 0x8D5;
/// MXCSR held: all exceptions masked, round toward zero, flush-to-zero.
pub const MXCSR_HELD: u32 = 0xFF80;

impl RegState {
    /// Distinct values for thread `seed`.
    pub fn new(seed: u64) -> RegState {
        let mut st = RegState {
            xmm_in: [[0; 2]; 16],
            xmm_out: [[0; 2]; 16],
            gpr_in: [0; 16],
            gpr_out: [0; 16],
            mxcsr_in: MXCSR_HELD,
            mxcsr_out: 0,
            mxcsr_saved: 0,
            _pad: 0,
            flags_out: 0,
        };
        for (i, x) in st.xmm_in.iter_mut().enumerate() {
            let i = i as u64 + 1;
            *x = [
                0x1111_2222_3333_4444u64.wrapping_mul(i) ^ seed.rotate_left(17),
                !(0x0f0f_0f0f_0f0f_0f0f_u64.wrapping_mul(i)) ^ seed,
            ];
        }
        for (i, g) in st.gpr_in.iter_mut().enumerate() {
            *g = (0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 1) ^ 0x8000_0000_0000_0000)
                .wrapping_add(seed.wrapping_mul(0x9E37_79B9));
        }
        st
    }

    /// Loads the registers, spins `iterations` times, stores them.
    pub fn hold(&mut self, iterations: u64) {
        // SAFETY: rbx and rbp are saved and restored on the stack; every other register the
        // block writes is declared as clobbered; MXCSR is restored; `self` is a live, 16-byte
        // aligned RegState (the offsets are pinned above).
        unsafe {
            core::arch::asm!(
                "push rbx",
                "push rbp",
                "stmxcsr [rax + 776]",
                "ldmxcsr [rax + 768]",
                "movdqa xmm0, [rax + 0]", "movdqa xmm1, [rax + 16]", "movdqa xmm2, [rax + 32]",
                "movdqa xmm3, [rax + 48]", "movdqa xmm4, [rax + 64]", "movdqa xmm5, [rax + 80]",
                "movdqa xmm6, [rax + 96]", "movdqa xmm7, [rax + 112]", "movdqa xmm8, [rax + 128]",
                "movdqa xmm9, [rax + 144]", "movdqa xmm10, [rax + 160]", "movdqa xmm11, [rax + 176]",
                "movdqa xmm12, [rax + 192]", "movdqa xmm13, [rax + 208]", "movdqa xmm14, [rax + 224]",
                "movdqa xmm15, [rax + 240]",
                "mov rbx, [rax + 520]", "mov rdx, [rax + 536]", "mov rsi, [rax + 544]",
                "mov rdi, [rax + 552]", "mov rbp, [rax + 560]", "mov r8, [rax + 576]",
                "mov r9, [rax + 584]", "mov r10, [rax + 592]", "mov r11, [rax + 600]",
                "mov r12, [rax + 608]", "mov r13, [rax + 616]", "mov r14, [rax + 624]",
                "mov r15, [rax + 632]",
                "push {flags}",
                "popfq",
                "2:",
                "pause",
                "lea rcx, [rcx - 1]",
                "jrcxz 3f",
                "jmp 2b",
                "3:",
                "pushfq",
                "pop qword ptr [rax + 784]",
                "movdqa [rax + 256], xmm0", "movdqa [rax + 272], xmm1", "movdqa [rax + 288], xmm2",
                "movdqa [rax + 304], xmm3", "movdqa [rax + 320], xmm4", "movdqa [rax + 336], xmm5",
                "movdqa [rax + 352], xmm6", "movdqa [rax + 368], xmm7", "movdqa [rax + 384], xmm8",
                "movdqa [rax + 400], xmm9", "movdqa [rax + 416], xmm10", "movdqa [rax + 432], xmm11",
                "movdqa [rax + 448], xmm12", "movdqa [rax + 464], xmm13", "movdqa [rax + 480], xmm14",
                "movdqa [rax + 496], xmm15",
                "mov [rax + 640], rax", "mov [rax + 648], rbx", "mov [rax + 656], rcx",
                "mov [rax + 664], rdx", "mov [rax + 672], rsi", "mov [rax + 680], rdi",
                "mov [rax + 688], rbp", "mov [rax + 704], r8", "mov [rax + 712], r9",
                "mov [rax + 720], r10", "mov [rax + 728], r11", "mov [rax + 736], r12",
                "mov [rax + 744], r13", "mov [rax + 752], r14", "mov [rax + 760], r15",
                "stmxcsr [rax + 772]",
                "ldmxcsr [rax + 776]",
                "cld",
                "pop rbp",
                "pop rbx",
                flags = const FLAGS_HELD,
                in("rax") self as *mut RegState,
                inout("rcx") iterations.max(1) => _,
                out("rdx") _, out("rsi") _, out("rdi") _, out("r8") _, out("r9") _, out("r10") _,
                out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _, out("xmm4") _,
                out("xmm5") _, out("xmm6") _, out("xmm7") _, out("xmm8") _, out("xmm9") _,
                out("xmm10") _, out("xmm11") _, out("xmm12") _, out("xmm13") _, out("xmm14") _,
                out("xmm15") _,
            );
        }
    }

    /// Checks what `hold` stored; the first difference, if any.
    pub fn check(&self) -> Result<(), alloc::string::String> {
        use alloc::format;
        if self.xmm_out != self.xmm_in {
            let i = (0..16)
                .find(|&i| self.xmm_out[i] != self.xmm_in[i])
                .unwrap_or(0);
            return Err(format!(
                "xmm{i} changed: {:x?} -> {:x?}",
                self.xmm_in[i], self.xmm_out[i]
            ));
        }
        for i in [1usize, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15] {
            if self.gpr_out[i] != self.gpr_in[i] {
                return Err(format!(
                    "GPR #{i} changed: {:#x} -> {:#x}",
                    self.gpr_in[i], self.gpr_out[i]
                ));
            }
        }
        if self.gpr_out[0] != self as *const RegState as u64 || self.gpr_out[2] != 0 {
            return Err(format!(
                "rax/rcx wrong: {:#x}/{:#x}",
                self.gpr_out[0], self.gpr_out[2]
            ));
        }
        if self.mxcsr_out != self.mxcsr_in {
            return Err(format!(
                "MXCSR changed: {:#x} -> {:#x}",
                self.mxcsr_in, self.mxcsr_out
            ));
        }
        if self.flags_out & FLAGS_MASK != FLAGS_HELD & FLAGS_MASK {
            return Err(format!(
                "RFLAGS changed: {:#x} -> {:#x}",
                FLAGS_HELD, self.flags_out
            ));
        }
        Ok(())
    }
}

/// Executes an undefined instruction (`ud2`): the CPU raises an exception at user level.
pub fn undefined_instruction() -> ! {
    // SAFETY: the instruction only raises an exception; the fault handler ends the guest.
    unsafe { core::arch::asm!("ud2", options(noreturn, nomem, nostack)) }
}
