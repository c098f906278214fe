//! aarch64 (EL0): the port's plan. Nothing is written yet here; the stub's aarch64 side is
//! (`guest-kernel-stub/src/arch/aarch64`, checked under arm64 KVM by `cargo xtask
//! aarch64-test`). What it gives this port, and how it differs from x86_64:
//!
//! * Interrupts reach EL0 with the EOI already done at EL1, on the interrupted stack, as a
//!   `protocol::arch::aarch64::IrqFrame` (x0, x1, pc, pstate, intid, sp) under which the stub's
//!   trampoline saved x2-x30, FPCR/FPSR and q0-q31; the trampoline returns with `svc #0`, which
//!   reloads pc, pstate (NZCV), sp, x0 and x1 from the frame: a handler switches threads by
//!   rewriting the frame. There is no EOI window (`trap_eoi_window` is empty) and no owed EOI.
//! * Every vCPU's upcall SPI is reported as `UPCALL_IRQ`; SGIs (reschedule, self-IPIs) are sent
//!   with `irqchip::send_sgi` (`svc #1`); the virtual timer (`TIMER_IRQ`) is armed from EL0
//!   (`irqchip::arm_timer_ticks`) and masked by the stub when it fires: re-arm it.
//! * `halt` is `wfi` at EL0 (no VMM exit); the per-vCPU block is `percpu`'s, through
//!   TPIDRRO_EL0, with migration-safe `local_add`/`local_or` (LL/SC, base re-read inside the
//!   loop) but two-instruction reads; TPIDR_EL0 is free for thread-local storage (the VMM
//!   saves and restores it in a `UserContext`).
//! * CPU exceptions at EL0 are still fatal (the stub records the handler but delivers nothing).
//!
//! The rest of the runtime reaches the architecture only through the names `arch/mod.rs`
//! re-exports; each must do here what the x86_64 one does:
//!
//! * `context`: `switch_out`/`switch_in` saving x19-x30, sp, FPCR and d8-d15 (callee-saved) with
//!   the same order of stores (`InSched` first, the commit last, then the pending check);
//!   `build_start_frame` for new threads; `suspend_scheduler`, `resume_switch_frame`,
//!   `jump_to_frame`, `abandon_to_scheduler`; the trap-frame layout of the stub's EL0
//!   trampoline (x0-x30, q0-q31, FPCR, FPSR, ELR, SPSR) for `build_resume_frame` and
//!   `capture` of a `protocol::arch::aarch64::UserContext`; `reset_fp_control` (FPCR);
//!   the accessors `pc`/`set_pc`/`sp` (ELR and SP of a context) and `frame_pc`/`set_frame_pc`/
//!   `frame_sp` (of an interrupt frame).
//! * `cpu`: the runtime's per-vCPU words in the stub's block (reached through TPIDRRO_EL0,
//!   readable at EL0; single-instruction access needs `ldr/str` with the base in a register
//!   loaded in the same restartable sequence), `word_of` for another vCPU's word, the hold and
//!   pending words, CNTVCT_EL0 for `rdtsc`, the EL1 virtual timer (INTID 27) for slices, SGIs
//!   through ICC_SGI1R_EL1 for `send_ipi`/`send_self_ipi`, `end_owed_interrupts` (EOI through
//!   ICC_EOIR1_EL1 of the runtime's INTIDs still active).
//! * `rseq`: the same restartable sequences (run-queue push/pop with `ldaxr/stlxr` or LSE `cas`
//!   as the commit, upcall-record take, idle `wfi`-style halt check, switch-in) and their PC
//!   table (`fixup`).
//! * `entry`: a new activation's first instructions (x0 = vCPU, x1 = activation id, sp = stack
//!   top): save the previous words (`OldWords`) on the new stack, claim the activation word with
//!   `swpal` (tagged `CLAIMING`), reset the words, call `__rt_activation_start`; `window`,
//!   `entry_address`, `in_entry` (unwinding the stub trampoline's frame) and `ENTRY_MARK_OFFSET`.
//! * The protocol's `UserContext` and the upcall, timer and reschedule interrupt numbers.
