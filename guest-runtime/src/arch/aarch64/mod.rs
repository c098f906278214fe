//! aarch64 (EL0): the port's plan. Nothing is written yet (the stub has no aarch64 side either,
//! `guest-kernel-stub/src/arch/aarch64`). The rest of the runtime reaches the architecture only
//! through the names `arch/mod.rs` re-exports; each must do here what the x86_64 one does:
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
