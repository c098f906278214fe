//! aarch64 register state that must survive preemption: x0-x17 and x19-x29 (x18 is the
//! platform register, x30 the link register), q0-q31, FPCR and NZCV are loaded with known
//! values, held through a spin loop that changes none of them (`sub` and `cbnz` leave NZCV
//! alone), then stored and compared.

/// The state `hold` loads and stores (offsets are used by the assembly).
#[repr(C, align(16))]
#[derive(Debug)]
pub struct RegState {
    pub q_in: [[u64; 2]; 32],
    pub q_out: [[u64; 2]; 32],
    /// By register number (x0 = the state's address, x1 = the loop counter on the way out).
    pub x_in: [u64; 32],
    pub x_out: [u64; 32],
    pub fpcr_in: u64,
    pub fpcr_out: u64,
    pub fpcr_saved: u64,
    pub nzcv_out: u64,
}

const _: () = {
    assert!(core::mem::offset_of!(RegState, q_out) == 512);
    assert!(core::mem::offset_of!(RegState, x_in) == 1024);
    assert!(core::mem::offset_of!(RegState, x_out) == 1280);
    assert!(core::mem::offset_of!(RegState, fpcr_in) == 1536);
    assert!(core::mem::offset_of!(RegState, fpcr_out) == 1544);
    assert!(core::mem::offset_of!(RegState, fpcr_saved) == 1552);
    assert!(core::mem::offset_of!(RegState, nzcv_out) == 1560);
};

/// Spins per `hold` in `fp-preemption`: ten times x86_64's, for 50 preemptions under QEMU's
/// emulation, whose timer interrupts arrive coarsely.
pub const HOLD_SPINS: u64 = 500_000;

/// N, C and V set, Z clear.
pub const NZCV_HELD: u64 = 0xB000_0000;
/// FPCR held: default NaN, flush-to-zero, round toward zero.
pub const FPCR_HELD: u64 = (1 << 25) | (1 << 24) | (3 << 22);
/// The GPRs `hold` loads and compares.
const HELD_GPRS: [usize; 27] = [
    2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
    29,
];

impl RegState {
    /// Distinct values for thread `seed`.
    pub fn new(seed: u64) -> RegState {
        let mut st = RegState {
            q_in: [[0; 2]; 32],
            q_out: [[0; 2]; 32],
            x_in: [0; 32],
            x_out: [0; 32],
            fpcr_in: FPCR_HELD,
            fpcr_out: 0,
            fpcr_saved: 0,
            nzcv_out: 0,
        };
        for (i, q) in st.q_in.iter_mut().enumerate() {
            let i = i as u64 + 1;
            *q = [
                0x1111_2222_3333_4444u64.wrapping_mul(i) ^ seed.rotate_left(17),
                !(0x0f0f_0f0f_0f0f_0f0f_u64.wrapping_mul(i)) ^ seed,
            ];
        }
        for (i, x) in st.x_in.iter_mut().enumerate() {
            *x = (0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 1) ^ 0x8000_0000_0000_0000)
                .wrapping_add(seed.wrapping_mul(0x9E37_79B9));
        }
        st
    }

    /// Loads the registers, spins `iterations` times, stores them.
    pub fn hold(&mut self, iterations: u64) {
        // SAFETY: x19 and x29 (not allowed as operands) are saved and restored on the stack;
        // every other register the block writes is declared as clobbered; FPCR is restored;
        // `self` is a live, 16-byte aligned RegState (the offsets are pinned above).
        unsafe {
            core::arch::asm!(
                "stp x19, x29, [sp, #-16]!",
                "mrs x9, fpcr",
                "str x9, [x0, #1552]",
                "ldr x9, [x0, #1536]",
                "msr fpcr, x9",
                "ldp q0, q1, [x0, #0]", "ldp q2, q3, [x0, #32]", "ldp q4, q5, [x0, #64]",
                "ldp q6, q7, [x0, #96]", "ldp q8, q9, [x0, #128]", "ldp q10, q11, [x0, #160]",
                "ldp q12, q13, [x0, #192]", "ldp q14, q15, [x0, #224]", "ldp q16, q17, [x0, #256]",
                "ldp q18, q19, [x0, #288]", "ldp q20, q21, [x0, #320]", "ldp q22, q23, [x0, #352]",
                "ldp q24, q25, [x0, #384]", "ldp q26, q27, [x0, #416]", "ldp q28, q29, [x0, #448]",
                "ldp q30, q31, [x0, #480]",
                "movz x9, #{nzcv}, lsl #16",
                "msr nzcv, x9",
                "add x30, x0, #1024",
                "ldp x2, x3, [x30, #16]", "ldp x4, x5, [x30, #32]", "ldp x6, x7, [x30, #48]",
                "ldp x8, x9, [x30, #64]", "ldp x10, x11, [x30, #80]", "ldp x12, x13, [x30, #96]",
                "ldp x14, x15, [x30, #112]", "ldp x16, x17, [x30, #128]",
                "ldp x19, x20, [x30, #152]", "ldp x21, x22, [x30, #168]",
                "ldp x23, x24, [x30, #184]", "ldp x25, x26, [x30, #200]",
                "ldp x27, x28, [x30, #216]", "ldr x29, [x30, #232]",
                "2:",
                "yield",
                "sub x1, x1, #1",
                "cbnz x1, 2b",
                "add x30, x0, #1280",
                "stp x0, x1, [x30, #0]",
                "stp x2, x3, [x30, #16]", "stp x4, x5, [x30, #32]", "stp x6, x7, [x30, #48]",
                "stp x8, x9, [x30, #64]", "stp x10, x11, [x30, #80]", "stp x12, x13, [x30, #96]",
                "stp x14, x15, [x30, #112]", "stp x16, x17, [x30, #128]",
                "stp x19, x20, [x30, #152]", "stp x21, x22, [x30, #168]",
                "stp x23, x24, [x30, #184]", "stp x25, x26, [x30, #200]",
                "stp x27, x28, [x30, #216]", "str x29, [x30, #232]",
                "mrs x9, nzcv",
                "str x9, [x0, #1560]",
                "stp q0, q1, [x0, #512]", "stp q2, q3, [x0, #544]", "stp q4, q5, [x0, #576]",
                "stp q6, q7, [x0, #608]", "stp q8, q9, [x0, #640]", "stp q10, q11, [x0, #672]",
                "stp q12, q13, [x0, #704]", "stp q14, q15, [x0, #736]", "stp q16, q17, [x0, #768]",
                "stp q18, q19, [x0, #800]", "stp q20, q21, [x0, #832]", "stp q22, q23, [x0, #864]",
                "stp q24, q25, [x0, #896]", "stp q26, q27, [x0, #928]", "stp q28, q29, [x0, #960]",
                "stp q30, q31, [x0, #992]",
                "mrs x9, fpcr",
                "str x9, [x0, #1544]",
                "ldr x9, [x0, #1552]",
                "msr fpcr, x9",
                "ldp x19, x29, [sp], #16",
                nzcv = const NZCV_HELD >> 16,
                in("x0") self as *mut RegState,
                inout("x1") iterations.max(1) => _,
                out("x2") _, out("x3") _, out("x4") _, out("x5") _, out("x6") _, out("x7") _,
                out("x8") _, out("x9") _, out("x10") _, out("x11") _, out("x12") _,
                out("x13") _, out("x14") _, out("x15") _, out("x16") _, out("x17") _,
                out("x20") _, out("x21") _, out("x22") _, out("x23") _, out("x24") _,
                out("x25") _, out("x26") _, out("x27") _, out("x28") _, out("x30") _,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _,
                out("v6") _, out("v7") _, out("v8") _, out("v9") _, out("v10") _,
                out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _,
                out("v21") _, out("v22") _, out("v23") _, out("v24") _, out("v25") _,
                out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _,
                out("v31") _,
            );
        }
    }

    /// Checks what `hold` stored; the first difference, if any.
    pub fn check(&self) -> Result<(), alloc::string::String> {
        use alloc::format;
        if self.q_out != self.q_in {
            let i = (0..32)
                .find(|&i| self.q_out[i] != self.q_in[i])
                .unwrap_or(0);
            return Err(format!(
                "q{i} changed: {:x?} -> {:x?}",
                self.q_in[i], self.q_out[i]
            ));
        }
        for i in HELD_GPRS {
            if self.x_out[i] != self.x_in[i] {
                return Err(format!(
                    "x{i} changed: {:#x} -> {:#x}",
                    self.x_in[i], self.x_out[i]
                ));
            }
        }
        if self.x_out[0] != self as *const RegState as u64 || self.x_out[1] != 0 {
            return Err(format!(
                "x0/x1 wrong: {:#x}/{:#x}",
                self.x_out[0], self.x_out[1]
            ));
        }
        if self.fpcr_out != self.fpcr_in {
            return Err(format!(
                "FPCR changed: {:#x} -> {:#x}",
                self.fpcr_in, self.fpcr_out
            ));
        }
        if self.nzcv_out & 0xF000_0000 != NZCV_HELD {
            return Err(format!(
                "NZCV changed: {:#x} -> {:#x}",
                NZCV_HELD, self.nzcv_out
            ));
        }
        Ok(())
    }
}

/// Executes an undefined instruction (`udf #0`): the CPU raises an exception at user level.
pub fn undefined_instruction() -> ! {
    // SAFETY: the instruction only raises an exception; the fault handler ends the guest.
    unsafe { core::arch::asm!("udf #0", options(noreturn, nomem, nostack)) }
}
