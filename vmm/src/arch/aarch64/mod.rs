//! aarch64 back end: not written yet. The protocol (`protocol::arch::aarch64`) and the guest
//! stub's aarch64 tree define the ABI; this module will mirror `arch/x86_64` (`layout`, `boot`,
//! `vcpu`) with a GICv3 and PSCI.
compile_error!("activm's aarch64 VMM back end is not implemented yet; see docs/architecture.md");
