//! One guest: its VM, memory, vCPU controls, activation state, outcome and counters.

use std::io::Write;
use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};
use protocol::shared::{SharedHeader, UpcallKind};

use crate::activation::{Activations, Event, QueueError};
use crate::allocator::{Allocator, GuestId, Slot};
use crate::arch::current as arch;
use crate::bootinfo::{self, HostFacts};
use crate::devices::blk::Disk;
use crate::error::Error;
use crate::memory::{GuestRam, Plan, StackSlots};
use crate::trace::Trace;
use crate::vcpu::VcpuControl;
use crate::vm::{Outcome, VmConfig};
use crate::{loader, rdtsc};

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

/// Per-guest counters for `--stats`.
#[derive(Debug, Default)]
pub struct GuestStats {
    /// Upcall records written, by `UpcallKind as usize`.
    pub upcalls: [AtomicU64; 7],
    /// Processors taken away with the context handed to the guest.
    pub preemptions: AtomicU64,
    /// Processors taken away behind the guest's back (oblivious time slicing).
    pub deschedules: AtomicU64,
    /// vCPUs that had to run forward from CPL0 before their context could be taken.
    pub run_forwards: AtomicU64,
    pub yields: AtomicU64,
    /// Preemptions deferred because the guest set `defer_preemption`.
    pub deferrals: AtomicU64,
    /// Times a new activation waited for the guest to refill its stack pool.
    pub stack_waits: AtomicU64,
    /// New activations canceled because they lost their processor before running.
    pub canceled: AtomicU64,
    /// Kick-to-context-captured delays of preemptions, in TSC ticks (a bounded sample).
    pub preempt_delays: Mutex<crate::stats::Reservoir>,
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
    /// The block device (`--disk`).
    pub disk: Option<Disk>,
    pub tsc_khz: u64,
    pub phases: Vec<(&'static str, u64)>,
    outcome: Mutex<Option<Outcome>>,
    /// Set when the guest stalls: every vCPU in `KVM_RUN` prints its registers when kicked.
    pub stall_snapshot: AtomicBool,
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

fn open_kvm() -> Result<Kvm, Error> {
    let kvm = Kvm::new()
        .map_err(|e| Error::KvmUnavailable(std::io::Error::from_raw_os_error(e.errno())))?;
    for (cap, name) in [
        (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
        (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
        (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        (Cap::SignalMsi, "KVM_CAP_SIGNAL_MSI"),
    ] {
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
    ) -> Result<Created, Error> {
        config
            .check()
            .map_err(|(key, what)| Error::Config(format!("{} {what}", key.flag())))?;
        let mut phases = Vec::new();
        let image = loader::inspect(&config.image, config.mem_size)?;
        let disk = config.disk.as_ref().map(Disk::open).transpose()?;
        phases.push(("image read and checked", rdtsc()));
        let kvm = open_kvm()?;
        let vm = kvm.create_vm().map_err(Error::kvm("KVM_CREATE_VM"))?;
        let ram = GuestRam::new(config.mem_size)?;
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
        phases.push(("VM created, guest RAM mapped", rdtsc()));
        // After the memory slot: with an irqchip present, adding the slot costs 6-12 ms instead
        // of 0.2 ms for 256 MiB on our KVM. (The cost moves to VM teardown, after the guest ran.)
        let arch_vm = arch::setup_vm(&kvm, &vm)?;
        phases.push(("irqchip created", rdtsc()));
        let header = loader::load(&config.image, &image, &ram)?;
        phases.push(("image loaded", rdtsc()));
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
        phases.push(("page tables and descriptors built", rdtsc()));
        let mut fds = Vec::new();
        for index in 0..config.vcpus {
            let fd = vm
                .create_vcpu(index as u64)
                .map_err(Error::kvm("KVM_CREATE_VCPU"))?;
            arch::configure_vcpu(&fd, &arch_vm, index, &plan)?;
            fds.push(fd);
        }
        phases.push(("vCPUs created and configured", rdtsc()));
        let tsc_khz = fds[0].get_tsc_khz().map(u64::from).unwrap_or(0);
        bootinfo::write(
            &ram,
            &plan,
            &config.args,
            HostFacts {
                tsc_khz,
                vmm_start_tsc: config.start_tsc,
                boot_timing: config.boot_timing,
            },
        )?;
        let id = procs.alloc.add_guest(config.vcpus as usize);
        let vcpus: Vec<Arc<VcpuControl>> = (0..config.vcpus)
            .map(|_| Arc::new(VcpuControl::default()))
            .collect();
        procs.register(id, vcpus.clone());
        if let Some(trace) = &trace {
            trace.name_guest(id, &name);
        }
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
            trace,
            disk,
            tsc_khz,
            phases,
            outcome: Mutex::new(None),
            stall_snapshot: AtomicBool::new(false),
            running: AtomicUsize::new(config.vcpus as usize),
            console: Mutex::new(console),
        };
        Ok(Created {
            guest: Arc::new(guest),
            fds,
        })
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

    pub fn console_write(&self, bytes: &[u8]) {
        let mut console = self.console.lock().unwrap_or_else(|e| e.into_inner());
        // The console is best effort: a closed stdout must not kill the guest.
        let _ = console.write_all(bytes).and_then(|_| console.flush());
    }

    /// Each vCPU's allocator slot and run-loop state (diagnostics for fault reports).
    fn describe_vcpus(&self) -> String {
        let view = self.procs.alloc.view(self.id);
        let table = self
            .procs
            .controls
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let controls = table.get(self.id);
        view.vcpus
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let state = controls
                    .and_then(|c| c.get(i))
                    .map(|c| format!("{:?}", c.state()))
                    .unwrap_or_default();
                format!("vCPU {i} {slot:?} {state}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A vCPU that holds a processor and is not being revoked, other than `except`.
    pub fn running_vcpu(&self, except: Option<u32>) -> Option<u32> {
        let view = self.procs.alloc.view(self.id);
        view.vcpus
            .iter()
            .enumerate()
            .find(|(i, s)| matches!(s, Slot::Running(_)) && Some(*i as u32) != except)
            .map(|(i, _)| i as u32)
    }

    /// Keep `event` pending, without interrupting anyone: it goes out with the next new
    /// activation, ahead of the next delivered event, or with the next quantum's retry.
    pub fn post_pending(&self, event: Event) {
        let kind = event.kind;
        match self.acts.post(&self.ram, &self.plan, event, None) {
            Ok(_) => {
                self.stats.upcalls[kind as usize].fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => self.finish(Outcome::fault(
                0,
                format!(
                    "the guest does not consume its upcalls: {} events pending",
                    self.acts.pending()
                ),
            )),
        }
    }

    /// Hand `event` to the guest: into the queue of a running vCPU (not `event.vcpu`) with the
    /// upcall interrupt, or pending until the next new activation. A guest that lets its queues
    /// fill up is stopped.
    pub fn deliver(&self, event: Event) {
        let kind = event.kind;
        let target = match kind {
            // USER goes to the vCPU it names (the caller checked it runs).
            UpcallKind::User => Some(event.vcpu),
            UpcallKind::Signal => self.running_vcpu(None),
            // Behind its BLOCKED record, in the same queue, while that queue's vCPU runs.
            UpcallKind::Unblocked => self
                .acts
                .blocked_record_queue(event.activation)
                .filter(|&v| {
                    v != event.vcpu
                        && matches!(
                            self.procs.alloc.view(self.id).vcpus.get(v as usize),
                            Some(Slot::Running(_))
                        )
                })
                .or_else(|| self.running_vcpu(Some(event.vcpu))),
            _ => self.running_vcpu(Some(event.vcpu)),
        };
        if target.is_none() && self.acts.enabled() {
            // It gave every processor back: it wants one again for this event.
            self.procs.revoke(self.procs.alloc.want_one(self.id));
        }
        let posted = self.acts.post(&self.ram, &self.plan, event, target);
        if posted.is_ok() {
            // Counted once, when it is written now or pending for the next activation.
            self.stats.upcalls[kind as usize].fetch_add(1, Ordering::Relaxed);
        }
        match posted {
            Ok(Some(vcpu)) => {
                if let Some(trace) = &self.trace {
                    trace.instant(self.id, vcpu, upcall_name(kind), 0);
                }
                if let Err(e) = arch::send_upcall_interrupt(&self.vm, vcpu) {
                    self.finish(Outcome::fault(
                        vcpu,
                        format!("cannot send the upcall interrupt: {e}"),
                    ));
                }
            }
            Ok(None) => {
                // Its target's activation ended meanwhile: to another running vCPU, or a
                // processor is wanted for it.
                if target.is_some() {
                    match self.running_vcpu(target) {
                        Some(vcpu) => self.flush_pending(vcpu),
                        None => self.procs.revoke(self.procs.alloc.want_one(self.id)),
                    }
                }
            }
            Err(QueueError::Full) => self.finish(Outcome::fault(
                target.unwrap_or(0),
                format!(
                    "the guest does not consume its upcalls, or corrupted its queue indices: \
                     no room in vCPU {}'s queue ({} events pending)",
                    target.unwrap_or(0),
                    self.acts.pending()
                ),
            )),
            Err(QueueError::Memory(e)) => {
                self.finish(Outcome::fault(0, format!("upcall queue: {e}")))
            }
        }
    }
}

impl Guest {
    /// Events that waited for a running vCPU go to `vcpu`, which is about to run or runs.
    pub fn flush_pending(&self, vcpu: u32) {
        if self.acts.pending() == 0 {
            return;
        }
        match self.acts.flush_pending(&self.ram, &self.plan, vcpu) {
            Ok(0) => {}
            Ok(_) => {
                if let Err(e) = arch::send_upcall_interrupt(&self.vm, vcpu) {
                    self.finish(Outcome::fault(
                        vcpu,
                        format!("cannot send the upcall interrupt: {e}"),
                    ));
                }
            }
            Err(e) => self.finish(Outcome::fault(vcpu, format!("upcall queue: {e:?}"))),
        }
    }

    /// Whether a vCPU of this guest has been granted a processor as a new activation and not
    /// started it yet (pending events will go out with its NEWPROC).
    pub fn starting_activation(&self) -> bool {
        self.procs
            .alloc
            .view(self.id)
            .vcpus
            .contains(&Slot::GrantedNew)
    }

    /// Pending events go now, with the upcall interrupt, to a running vCPU the guest does not
    /// mark idle (`SharedHeader::idle_vcpus`). If every running vCPU idles they stay pending
    /// (they go out with the next delivered event, new activation or quantum retry): an idle
    /// vCPU has nothing to do with them, and waking it from a halt costs ~40 us.
    pub fn flush_to_busy(&self) {
        let idle = self
            .ram
            .read_u64(self.plan.shared_area.start + offset_of!(SharedHeader, idle_vcpus) as u64)
            .unwrap_or(0);
        let view = self.procs.alloc.view(self.id);
        let busy = view
            .vcpus
            .iter()
            .enumerate()
            .find(|&(i, s)| matches!(s, Slot::Running(_)) && (i >= 64 || idle & (1 << i) == 0));
        if let Some((vcpu, _)) = busy {
            self.flush_pending(vcpu as u32);
        }
    }

    /// Called every quantum: retry events that found no room, and stop a guest whose queues
    /// have had no room for a second (it does not consume its upcalls, or corrupted them).
    pub fn retry_pending(&self) {
        if !self.acts.enabled() || self.acts.pending() == 0 || self.outcome().is_some() {
            return;
        }
        match self.running_vcpu(None) {
            Some(vcpu) => self.flush_pending(vcpu),
            None => self.procs.revoke(self.procs.alloc.want_one(self.id)),
        }
        if let Some(stalled) = self.acts.stalled_for() {
            if stalled > UPCALL_STALL_LIMIT {
                // Where was each vCPU? Kick them all; those in `KVM_RUN` print their registers.
                self.stall_snapshot.store(true, Ordering::Release);
                for control in &self.vcpus {
                    control.kick();
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                self.finish(Outcome::fault(
                    self.running_vcpu(None).unwrap_or(0),
                    format!(
                        "the guest does not consume its upcalls, or corrupted its queue indices: \
                         no room in its queues for {stalled:?} ({} events pending)\n  {}\n  \
                         allocator: {}",
                        self.acts.pending(),
                        self.acts.describe(&self.ram, &self.plan),
                        self.describe_vcpus()
                    ),
                ));
            }
        }
    }
}

/// How long a guest's upcall queues may stay without room before the guest is stopped.
pub const UPCALL_STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

pub fn upcall_name(kind: UpcallKind) -> &'static str {
    match kind {
        UpcallKind::NewProc => "upcall NEWPROC",
        UpcallKind::Preempted => "upcall PREEMPTED",
        UpcallKind::Blocked => "upcall BLOCKED",
        UpcallKind::Unblocked => "upcall UNBLOCKED",
        UpcallKind::Signal => "upcall SIGNAL",
        UpcallKind::User => "upcall USER",
    }
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
