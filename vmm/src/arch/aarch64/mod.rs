//! aarch64 back end: not written yet. The ABI is defined (`protocol::arch::aarch64`, the guest
//! stub's aarch64 tree); this module will have the shape of `arch/x86_64` (`layout`, `boot`,
//! `vcpu`, `context`, `exit`) and provide every item `arch/current.rs` lists. The plan, item
//! by item:
//!
//! - `layout`: the `virt` machine: RAM from `RAM_BASE`, the hypercall page and the GICv3
//!   distributor/redistributors below it (`GICD_BASE`, `GICR_BASE`); the VMM's boot structures
//!   (BootInfo, argument block, EL1 stacks) at the start of RAM instead of below 2 MiB.
//! - `boot`: no descriptor tables; the stage-1 page tables (4 KiB granule, EL0 and EL1
//!   mappings as on x86_64, the hypercall page Device-nGnRE, never cached) and the exception
//!   vector table's address for `VBAR_EL1`. `vmm_regions` and `write_tables` as today.
//! - `setup_vm` / `ArchVm`: `KVM_ARM_PREFERRED_TARGET` once per VM (the `kvm_vcpu_init`
//!   every vCPU is initialised with, with `KVM_ARM_VCPU_PSCI_0_2`), then an in-kernel vGICv3
//!   (`KVM_CREATE_DEVICE` of `KVM_DEV_TYPE_ARM_VGIC_V3`, its distributor and redistributor
//!   addresses set, `KVM_DEV_ARM_VGIC_CTRL_INIT` after the vCPUs exist).
//! - `configure_vcpu`: `KVM_ARM_VCPU_INIT` with the preferred target; then, through
//!   `KVM_SET_ONE_REG`: `PC` = entry, `SP_EL1` = the vCPU's EL1 stack, `X0` = BootInfo,
//!   `X1` = index, `X2` = its EL0 boot stack, `PSTATE` = EL1h with DAIF masked, `MPIDR`
//!   readable as the index. Secondary vCPUs start runnable (PSCI `CPU_ON` is not used: every
//!   vCPU enters at once, as on x86_64).
//! - `send_upcall_interrupt`: `KVM_IRQ_LINE` of the SGI `UPCALL_IRQ` aimed at the vCPU
//!   (or a GICv3 `ICC_SGI1R_EL1` write on the sender's behalf): one VM ioctl, no exit.
//! - `prepare_run`: nothing (arm64 has no `kvm_sync_regs`); every register read below is a
//!   `KVM_GET_ONE_REG`, so the hand-off reads only the few it needs.
//! - `hypercall_args` / `set_hypercall_result`: a hypercall is the same 8-byte load from the
//!   hypercall page (an MMIO exit); arguments in `X0..X3` (ONE_REG), the result in
//!   `kvm_run.mmio.data` as on x86_64 (KVM writes the load's destination register).
//! - `describe_pc`: `pc 0x...` from ONE_REG `PC`.
//! - `halt` / `make_runnable`: `KVM_SET_MP_STATE` with `KVM_MP_STATE_SUSPENDED` (a WFI-like
//!   sleep; needs `KVM_CAP_ARM_SYSTEM_SUSPEND`, else the guest's `wfi` is used and `halt`
//!   becomes a no-op) and `KVM_MP_STATE_RUNNABLE`.
//! - `timestamp` / `timestamp_khz`: `CNTVCT_EL0` (`mrs`) and `CNTFRQ_EL0`; the guest's virtual
//!   counter offset is zeroed (`KVM_ARM_SET_COUNTER_OFFSET`) so guest and VMM times compare.
//! - `at_user_level`: `PSTATE.M` is EL0t and `PSTATE.I` clear (ONE_REG `PSTATE`).
//! - `take_user_context`: `X0..X30`, `SP_EL0`, `PC`, `PSTATE`, `TPIDR_EL0` and the FP/SIMD
//!   registers `V0..V31`, `FPSR`, `FPCR` (ONE_REG each) into `protocol`'s aarch64
//!   `UserContext`.
//! - `enter_activation`: `PC` = entry, `SP_EL0` = stack top (16-byte aligned, no return
//!   address: `X30` = 0), `X0` = vCPU, `X1` = activation, `PSTATE` = EL0t; `at_activation_entry`
//!   compares `PC` and `SP_EL0` with those.
//! - `dump` / `fatal_trap_report`: the general registers, `ESR_EL1`, `FAR_EL1`, `ELR_EL1`,
//!   `SPSR_EL1`, with the exception class named; `TRIPLE_FAULT_CODE` becomes an `hvc` with no
//!   PSCI function, which KVM reports as a system event.
//! - `REQUIRED_CAPS`: `KVM_CAP_ARM_PSCI_0_2`, `KVM_CAP_ONE_REG`, `KVM_CAP_IRQCHIP` (vGIC);
//!   `INTERNAL_ERROR_HINT`: what an unemulated instruction means there.
//! - `ELF_MACHINE`: 183 (EM_AARCH64).
compile_error!("activm's aarch64 VMM back end is not implemented yet; see docs/architecture.md");
