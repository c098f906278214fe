//! TODO(aarch64): GICv3 from EL0/EL1: enable the CPU interface, acknowledge/EOI (ICC_IAR1_EL1,
//! ICC_EOIR1_EL1), send SGIs (ICC_SGI1R_EL1).
