//! The runtime's words of the stub's per-vCPU block: the same on every architecture; each
//! architecture's `cpu` module reads and writes them its own way (`%gs` on x86_64, TPIDRRO_EL0 on
//! aarch64).

/// A runtime word of the per-vCPU block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Word {
    /// `*const Pcpu`: the runtime's per-vCPU structure (run queue, caches).
    Pcpu = 0,
    /// `*const Tcb` of the thread running on this vCPU; 0 while the scheduler runs.
    Current = 1,
    /// 1 while this vCPU runs scheduler code (its activation stack), or is between
    /// `switch_out` and `switch_in`: interrupt handlers must not switch threads.
    InSched = 2,
    /// Top of this activation's stack, where the scheduler starts afresh.
    SchedTop = 3,
    /// Counter deadline (the TSC, CNTVCT_EL0 on aarch64) the one-shot timer is armed for;
    /// 0 = not armed.
    Armed = 4,
    /// Id of the activation now running on this vCPU.
    Activation = 5,
    /// 1 while the scheduler idles with nothing in flight (a preempted context taken here can
    /// be dropped).
    SchedIdle = 6,
    /// `*const VcpuArea`: this vCPU's part of the activation shared area.
    Area = 7,
}
