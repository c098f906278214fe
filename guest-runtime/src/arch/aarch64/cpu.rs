//! TODO(aarch64): the runtime's per-vCPU words in the stub's block (reached through
//! TPIDRRO_EL0, readable at EL0; single-instruction access needs `ldr/str` with the base in a
//! register loaded in the same restartable sequence), CNTVCT_EL0 for time, the EL1 virtual timer
//! (INTID 27) for slices, SGIs through ICC_SGI1R_EL1 for IPIs.
