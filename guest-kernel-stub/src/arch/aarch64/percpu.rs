//! TODO(aarch64): the per-vCPU block, reached through TPIDRRO_EL0 (readable at EL0), with
//! `vcpu_id()` and `this_cpu()` like `arch::x86_64::percpu`.
