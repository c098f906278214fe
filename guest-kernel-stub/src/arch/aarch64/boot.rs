//! TODO(aarch64): the `BootHeader` (`vectors` = VBAR_EL1 table, stride 0), `_start` at EL1
//! (record CNTVCT into `first_insn_tsc`, set TPIDR_EL0/TPIDRRO_EL0 to this vCPU's block, `eret`
//! to EL0), and the EL0 entry calling `crate::start::vcpu_main`.
