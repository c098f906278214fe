//! One guest: its VM, memory, vCPU controls, activation state, outcome and counters.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};

use crate::activation::{Activations, SharedArea};
use crate::allocator::{Allocator, GuestId, SleeperProbe, Sleepers};
use crate::arch::current as arch;
use crate::bootinfo::{self, HostFacts};
use crate::config::VmConfig;
use crate::devices::blk::Disk;
use crate::error::Error;
use crate::kick::VcpuControl;
use crate::loader;
use crate::memory::{GuestRam, Plan, StackSlots};
use crate::stats::GuestStats;
use crate::timeline::Timeline;
use crate::trace::Trace;
use crate::vm::Outcome;

/// The physical CPUs shared by every guest of one monitor: the allocator and a way to reach
/// each vCPU it names.
#[derive(Debug)]
pub struct Processors {
    pub alloc: Allocator,
    controls: RwLock<Vec<Vec<Arc<VcpuControl>>>>,
    /// Signalled whenever a guest finishes.
    pub finished: (Mutex<usize>, Condvar),
}

impl Processors {
    pub fn new(alloc: Allocator) -> Processors {
        Processors {
            alloc,
            controls: RwLock::new(Vec::new()),
            finished: (Mutex::new(0), Condvar::new()),
        }
    }

    fn register(&self, guest: GuestId, controls: Vec<Arc<VcpuControl>>) {
        let mut table = self.controls.write().unwrap_or_else(|e| e.into_inner());
        if table.len() <= guest {
            table.resize(guest + 1, Vec::new());
        }
        table[guest] = controls;
    }

    /// Kick the vCPUs the allocator wants processors back from.
    pub fn revoke(&self, kicks: Vec<(GuestId, usize)>) {
        if kicks.is_empty() {
            return;
        }
        let table = self.controls.read().unwrap_or_else(|e| e.into_inner());
        for (guest, vcpu) in kicks {
            if let Some(control) = table.get(guest).and_then(|g| g.get(vcpu)) {
                control.revoke();
            }
        }
    }
}

impl Processors {
    /// Kick vCPU `victim` at `at` (see [`Allocator::yield_until`]).
    pub fn kick_at(&self, (guest, vcpu): (GuestId, usize), at: std::time::Instant) -> bool {
        let table = self.controls.read().unwrap_or_else(|e| e.into_inner());
        table
            .get(guest)
            .and_then(|g| g.get(vcpu))
            .is_some_and(|control| control.kick_at(at))
    }
}

/// One guest.
pub struct Guest {
    pub id: GuestId,
    pub name: String,
    pub config: VmConfig,
    pub vm: VmFd,
    pub ram: GuestRam,
    pub plan: Plan,
    pub vcpus: Vec<Arc<VcpuControl>>,
    pub acts: Activations,
    pub procs: Arc<Processors>,
    pub stats: GuestStats,
    pub trace: Option<Arc<Trace>>,
    /// The runtime's timeline, merged into `trace` (with `--trace`).
    pub timeline: Option<Timeline>,
    /// The block device (`--disk`).
    pub disk: Option<Disk>,
    /// The host directories mapped into the guest (`--mount`) and its open files.
    pub files: crate::devices::fs::FileSystem,
    /// Sockets through host sockets (`--publish`, `--allow-connect`).
    pub net: Option<crate::devices::net::Net>,
    pub tsc_khz: u64,
    pub phases: Vec<(&'static str, u64)>,
    outcome: Mutex<Option<Outcome>>,
    /// The hang report, when the VMM stops the guest (`hang/`).
    pub hang: crate::hang::state::HangState,
    /// Testing only: the `--preempt-at` points (`preempt_at.rs`).
    pub preempt_at: Option<crate::preempt_at::Hooks>,
    running: AtomicUsize,
    console: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Arm the `--preempt-at` points in the loaded image and watch the breakpoint gate on every
/// vCPU (before any runs: the vCPU threads may not make that ioctl).
fn preempt_hooks(
    spec: &crate::preempt_at::Spec,
    config: &VmConfig,
    image: &loader::ImageInfo,
    ram: &GuestRam,
    plan: &Plan,
    fds: &[VcpuFd],
) -> Result<crate::preempt_at::Hooks, Error> {
    let gate = arch::preempt::breakpoint_gate(plan);
    for fd in fds {
        arch::preempt::watch_breakpoint_gate(fd, gate)?;
    }
    let vectors = plan.vectors..plan.vectors + 256 * plan.vector_stride;
    crate::preempt_at::Hooks::arm(spec, &config.image, image, ram, vectors, gate)
}

fn open_kvm() -> Result<Kvm, Error> {
    let kvm = Kvm::new()
        .map_err(|e| Error::KvmUnavailable(std::io::Error::from_raw_os_error(e.errno())))?;
    let common = [
        (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
    ];
    for &(cap, name) in common.iter().chain(arch::REQUIRED_CAPS) {
        if !kvm.check_extension(cap) {
            return Err(Error::KvmCapability(name));
        }
    }
    Ok(kvm)
}

/// Everything needed to start a guest's vCPU threads.
#[derive(Debug)]
pub struct Created {
    pub guest: Arc<Guest>,
    pub fds: Vec<VcpuFd>,
}

impl Guest {
    /// Check the image, create the VM and its vCPUs, load the guest and write its boot data.
    pub fn create(
        config: &VmConfig,
        name: String,
        console: Box<dyn Write + Send>,
        procs: &Arc<Processors>,
        activations_allowed: bool,
        trace: Option<Arc<Trace>>,
        preempt_at: Option<&crate::preempt_at::Spec>,
    ) -> Result<Created, Error> {
        config
            .check()
            .map_err(|(key, what)| Error::Config(format!("{} {what}", key.flag())))?;
        let mut phases = Vec::new();
        let image = loader::inspect(&config.image, config.mem_size)?;
        let disk = config.disk.as_ref().map(Disk::open).transpose()?;
        let files = crate::devices::fs::FileSystem::open(&config.mounts)?;
        let net = (!config.net.is_empty())
            .then(|| crate::devices::net::Net::open(&config.net))
            .transpose()
            .map_err(|e| Error::Host(e.to_string()))?;
        phases.push(("image read and checked", arch::timestamp()));
        let kvm = open_kvm()?;
        let vm = kvm.create_vm().map_err(Error::kvm("KVM_CREATE_VM"))?;
        let ram = GuestRam::new(config.mem_size)?;
        if config.prefault {
            ram.prefault()?;
            phases.push(("guest RAM faulted in", arch::timestamp()));
        }
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: config.mem_size,
            userspace_addr: ram.host_base(),
        };
        // SAFETY: the region is `ram`'s mapping of `mem_size` bytes; the `Guest` owns both `ram`
        // and the VM fd, and `ram` is declared after `vm` so the VM is closed before the
        // mapping goes (the mmap does not move with the struct).
        unsafe { vm.set_user_memory_region(region) }
            .map_err(Error::kvm("KVM_SET_USER_MEMORY_REGION"))?;
        phases.push(("VM created, guest RAM mapped", arch::timestamp()));
        // After the memory slot: with an irqchip present, adding the slot costs 6-12 ms instead
        // of 0.2 ms for 256 MiB on our KVM. (The cost moves to VM teardown, after the guest ran.)
        let arch_vm = arch::setup_vm(&kvm, &vm)?;
        phases.push(("irqchip created", arch::timestamp()));
        let header = loader::load(&config.image, &image, &ram)?;
        phases.push(("image loaded", arch::timestamp()));
        let plan = Plan::new(
            config.vcpus,
            config.mem_size,
            image.span.clone(),
            header.vectors,
            header.vector_stride,
            image.entry,
            StackSlots::new(
                config.thread_stack_size,
                config.thread_stacks,
                config.mem_size,
            )?,
        )?;
        arch::boot::write_tables(&ram, &plan)?;
        phases.push(("page tables and descriptors built", arch::timestamp()));
        let mut fds = Vec::new();
        for index in 0..config.vcpus {
            let fd = vm
                .create_vcpu(index as u64)
                .map_err(Error::kvm("KVM_CREATE_VCPU"))?;
            arch::configure_vcpu(&fd, &arch_vm, index, &plan)?;
            fds.push(fd);
        }
        phases.push(("vCPUs created and configured", arch::timestamp()));
        let preempt_at = match preempt_at {
            Some(spec) => Some(preempt_hooks(spec, config, &image, &ram, &plan, &fds)?),
            None => None,
        };
        let tsc_khz = arch::timestamp_khz(&fds[0]);
        bootinfo::write(
            &ram,
            &plan,
            &config.args,
            &config.env,
            HostFacts {
                tsc_khz,
                vmm_start_tsc: config.start_tsc,
                boot_timing: config.boot_timing,
                timeline: trace.is_some(),
            },
        )?;
        let id = procs.alloc.add_guest(config.vcpus as usize);
        procs
            .alloc
            .set_latency_critical(id, config.latency_critical);
        let vcpus: Vec<Arc<VcpuControl>> = (0..config.vcpus)
            .map(|_| Arc::new(VcpuControl::default()))
            .collect();
        procs.register(id, vcpus.clone());
        if let Some(trace) = &trace {
            trace.name_guest(id, &name);
        }
        let timeline = trace.as_ref().map(|_| Timeline::new(config.vcpus));
        let guest = Guest {
            id,
            name,
            config: config.clone(),
            vm,
            ram,
            plan,
            vcpus,
            acts: Activations::new(config.vcpus, activations_allowed),
            procs: Arc::clone(procs),
            stats: GuestStats::default(),
            timeline,
            trace,
            disk,
            files,
            net,
            tsc_khz,
            phases,
            outcome: Mutex::new(None),
            hang: Default::default(),
            preempt_at,
            running: AtomicUsize::new(config.vcpus as usize),
            console: Mutex::new(console),
        };
        let guest = Arc::new(guest);
        if config.latency_critical {
            procs.alloc.watch_sleepers(id, sleeper_probe(&guest));
        }
        Ok(Created { guest, fds })
    }

    /// Record the guest's outcome (the first one wins), stop its vCPUs, free its processors.
    pub fn finish(&self, outcome: Outcome) {
        let mut slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return;
        }
        *slot = Some(outcome);
        drop(slot);
        for vcpu in &self.vcpus {
            vcpu.request_stop();
        }
        self.procs.revoke(self.procs.alloc.remove_guest(self.id));
        let (count, cv) = &self.procs.finished;
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A vCPU stopped itself; when the last one does, the guest is over.
    pub fn vcpu_stopped(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(Outcome::AllStopped);
        }
    }

    /// The guest's shared area, as the VMM reads and writes it.
    pub fn shared(&self) -> SharedArea<'_> {
        SharedArea::new(&self.ram, &self.plan)
    }

    pub fn console_write(&self, bytes: &[u8]) {
        let mut console = self.console.lock().unwrap_or_else(|e| e.into_inner());
        // The console is best effort: a closed stdout must not kill the guest.
        let _ = console.write_all(bytes).and_then(|_| console.flush());
    }
}

/// Reads `guest`'s earliest sleeper (`SharedHeader::earliest_sleeper`) in nanoseconds of its
/// clock (the TSC) and its idle vCPUs, for the allocator (`Allocator::watch_sleepers`). Holds
/// the guest weakly: the allocator outlives no guest it serves, and must not keep one alive.
fn sleeper_probe(guest: &Arc<Guest>) -> SleeperProbe {
    let guest = Arc::downgrade(guest);
    SleeperProbe(Arc::new(move || {
        let guest = guest.upgrade()?;
        let shared = guest.shared();
        let tsc = shared.earliest_sleeper()?;
        let earliest_ns = if tsc == u64::MAX {
            u64::MAX
        } else {
            let ns = u128::from(tsc) * 1_000_000 / u128::from(guest.tsc_khz.max(1));
            u64::try_from(ns).unwrap_or(u64::MAX - 1)
        };
        Some(Sleepers {
            earliest_ns,
            idle_vcpus: shared.idle_vcpus(),
        })
    }))
}

/// A console that prefixes every line with a guest's name (when several guests share stdout).
#[derive(Debug)]
pub struct PrefixedConsole<W: Write> {
    prefix: String,
    inner: W,
    at_line_start: bool,
}

impl<W: Write> PrefixedConsole<W> {
    pub fn new(prefix: String, inner: W) -> Self {
        PrefixedConsole {
            prefix,
            inner,
            at_line_start: true,
        }
    }
}

impl<W: Write> Write for PrefixedConsole<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len() + self.prefix.len());
        for &byte in buf {
            if self.at_line_start {
                out.extend_from_slice(self.prefix.as_bytes());
            }
            out.push(byte);
            self.at_line_start = byte == b'\n';
        }
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The runtime's timeline (`timeline.rs`), when a trace is recorded.
impl Guest {
    /// Merge what the guest's timeline rings hold into the trace.
    pub fn drain_timeline(&self) {
        if let (Some(timeline), Some(trace)) = (&self.timeline, &self.trace) {
            timeline.drain(&self.ram, trace, self.id);
        }
    }

    /// vCPU `vcpu`'s context was handed over (`kind`: PREEMPTED or BLOCKED) at `tsc`.
    pub fn timeline_handed_over(&self, vcpu: u32, kind: protocol::shared::UpcallKind, tsc: u64) {
        if let (Some(timeline), Some(trace)) = (&self.timeline, &self.trace) {
            timeline.handed_over(&self.ram, trace, self.id, vcpu, kind, tsc);
        }
    }

    /// The guest ended: the rest of its timeline.
    pub fn finish_timeline(&self) {
        if let (Some(timeline), Some(trace)) = (&self.timeline, &self.trace) {
            timeline.finish(&self.ram, trace, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_console_prefixes_lines() {
        let mut console = PrefixedConsole::new("[a] ".into(), Vec::new());
        console.write_all(b"one\ntw").unwrap();
        console.write_all(b"o\n").unwrap();
        assert_eq!(console.inner, b"[a] one\n[a] two\n");
    }
}
