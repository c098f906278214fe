//! aarch64: the port's plan. Nothing is written yet, so the stub does not build for aarch64 (the
//! protocol side is ready: `protocol::arch::aarch64`). The guest's EL1 code is the counterpart
//! of CPL0 (a handful of instructions per exception); everything else runs at EL0. Each item
//! below is what the x86_64 module of the same name provides, and what it must do here.
//!
//! * `boot`: the `BootHeader` (`vectors` = the VBAR_EL1 table, stride 0); `_start` at EL1
//!   records CNTVCT in `first_insn_tsc`, points TPIDR_EL0/TPIDRRO_EL0 at this vCPU's block and
//!   `eret`s to EL0; the EL0 entry calls `crate::start::vcpu_main`.
//! * `hypercall`: the hypercall instruction, `ldr x0, [addr]`, arguments in x0-x3 (see
//!   `protocol::hypercall`).
//! * `irqchip`: GICv3 from EL0/EL1: enable the CPU interface, acknowledge and EOI
//!   (ICC_IAR1_EL1, ICC_EOIR1_EL1), send SGIs (ICC_SGI1R_EL1); the EL1 virtual timer (INTID 27).
//! * `percpu`: the per-vCPU block, reached through TPIDRRO_EL0 (readable at EL0), with
//!   `vcpu_id()`, `this_cpu()`, `cpu_local()`, and single-instruction `hold_enter`/`hold_leave`
//!   on the hold count (`ldr`/`str` with the base loaded in the same restartable sequence, or an
//!   LSE `ldadd`) and `gs_read`/`gs_or`-style accessors for the pending word.
//! * `traps`: the VBAR_EL1 vector table. Synchronous exceptions from EL0/EL1 and anything from
//!   EL1 are fatal (`fatal_trap`); IRQs from EL0 are delivered to an EL0 trampoline
//!   signal-style (save x0-x30, q0-q31, FPCR, FPSR), with `trap_eoi_window`, the exception
//!   handler hooks and `IrqFrame` as on x86_64.
//! * `rdtsc` (CNTVCT_EL0) and `current_cpl` (the exception level from CurrentEL, read at EL1
//!   only: EL0 reports 3 by convention); `init_vcpu` enables the GIC CPU interface;
//!   `check_boot_info` checks the GIC's base against `protocol::arch::aarch64`.
//!
//! `link.ld` in this folder is the linker script the build script hands to lld.
