//! Creating and running one guest: KVM set-up, loading, the vCPU threads, the outcome.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Cap, Kvm};
use protocol::boot::VcpuBoot;

use crate::arch::current as arch;
use crate::bootinfo::{self, HostFacts};
use crate::error::Error;
use crate::memory::{GuestRam, Plan, StackSlots};
use crate::vcpu::{self, VcpuControl};
use crate::{loader, rdtsc};

/// Exit status when the guest panicked.
pub const EXIT_GUEST_PANIC: i32 = 101;
/// Exit status when the guest faulted or broke the protocol.
pub const EXIT_GUEST_FAULT: i32 = 125;
/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;

/// What to run.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub image: PathBuf,
    pub vcpus: u32,
    pub mem_size: u64,
    pub args: Vec<String>,
    pub boot_timing: bool,
    pub timeout: Option<Duration>,
    /// Host TSC at process start, for boot timing.
    pub start_tsc: u64,
    /// Usable bytes of each guard-paged thread stack, and how many (default: a quarter of RAM).
    pub thread_stack_size: u64,
    pub thread_stacks: Option<u32>,
}

impl VmConfig {
    /// A configuration with activm's defaults for everything but the image.
    pub fn new(image: impl Into<PathBuf>) -> VmConfig {
        VmConfig {
            image: image.into(),
            vcpus: 1,
            mem_size: 256 << 20,
            args: Vec::new(),
            boot_timing: false,
            timeout: None,
            start_tsc: crate::rdtsc(),
            thread_stack_size: DEFAULT_THREAD_STACK,
            thread_stacks: None,
        }
    }
}

/// Usable bytes of a thread stack unless `--thread-stack` says otherwise.
pub const DEFAULT_THREAD_STACK: u64 = 124 * 1024;

/// How a guest ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest called `exit(code)`.
    Exited(i32),
    /// The guest panicked with this message.
    Panicked { vcpu: u32, message: String },
    /// The guest faulted or broke the protocol; `report` says how, with registers.
    Fault { vcpu: u32, report: String },
    /// Every vCPU stopped without the guest calling `exit`.
    AllStopped,
    /// `--timeout` expired.
    TimedOut(Duration),
}

impl Outcome {
    pub fn fault(vcpu: u32, report: String) -> Outcome {
        Outcome::Fault { vcpu, report }
    }

    /// The process exit status this outcome maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(code) => *code,
            Outcome::Panicked { .. } => EXIT_GUEST_PANIC,
            Outcome::Fault { .. } | Outcome::AllStopped => EXIT_GUEST_FAULT,
            Outcome::TimedOut(_) => EXIT_TIMEOUT,
        }
    }

    /// A message for stderr, if the outcome is not a plain exit.
    pub fn describe(&self) -> Option<String> {
        match self {
            Outcome::Exited(_) => None,
            Outcome::Panicked { vcpu, message } => {
                Some(format!("guest panicked on vCPU {vcpu}: {message}"))
            }
            Outcome::Fault { report, .. } => Some(format!("guest fault: {report}")),
            Outcome::AllStopped => Some("every vCPU stopped without the guest calling exit".into()),
            Outcome::TimedOut(after) => Some(format!(
                "guest still running after the {after:?} timeout; stopped"
            )),
        }
    }
}

/// Boot milestones in host TSC ticks.
#[derive(Clone, Debug)]
pub struct BootTiming {
    pub tsc_khz: u64,
    pub process_start: u64,
    /// VMM milestones in order: (what was done, TSC when it was).
    pub phases: Vec<(&'static str, u64)>,
    /// Per vCPU: first guest instruction and arrival in the guest's main code (0 = not reached).
    pub vcpus: Vec<(u64, u64)>,
}

impl BootTiming {
    /// Microseconds from process start to `tsc` (NaN if never reached).
    pub fn us_since_start(&self, tsc: u64) -> f64 {
        if tsc < self.process_start || tsc == 0 {
            return f64::NAN;
        }
        (tsc - self.process_start) as f64 * 1000.0 / self.tsc_khz as f64
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "boot timing (us from activm start, TSC {} kHz):\n",
            self.tsc_khz
        );
        for (what, tsc) in &self.phases {
            out += &format!("  {what:<32} {:10.1}\n", self.us_since_start(*tsc));
        }
        for (i, (first, main)) in self.vcpus.iter().enumerate() {
            out += &format!(
                "  vCPU {i}: first guest instruction {:10.1}, guest main {:10.1}\n",
                self.us_since_start(*first),
                self.us_since_start(*main)
            );
        }
        out
    }
}

/// The result of a run.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    pub timing: Option<BootTiming>,
    /// Exits handled per vCPU: (hypercalls, kicks, other).
    pub exits: Vec<(usize, usize, usize)>,
}

/// State shared by the vCPU threads of one guest.
pub struct VmShared {
    pub ram: GuestRam,
    pub plan: Plan,
    pub vcpus: Vec<VcpuControl>,
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
    running: AtomicUsize,
    console: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for VmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmShared")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl VmShared {
    /// Record the guest's outcome (the first one wins) and stop every vCPU.
    pub fn finish(&self, outcome: Outcome) {
        let mut slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(outcome);
        }
        drop(slot);
        self.done.notify_all();
        for vcpu in &self.vcpus {
            vcpu.request_stop();
        }
    }

    /// A vCPU stopped itself; when the last one does, the guest is over.
    pub fn vcpu_stopped(&self, _index: u32) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(Outcome::AllStopped);
        }
    }

    pub fn console_write(&self, bytes: &[u8]) {
        let mut console = self.console.lock().unwrap_or_else(|e| e.into_inner());
        // The console is best effort: a closed stdout must not kill the guest.
        let _ = console.write_all(bytes).and_then(|_| console.flush());
    }

    fn wait(&self, timeout: Option<Duration>) -> Outcome {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(outcome) = slot.clone() {
                return outcome;
            }
            match deadline {
                None => slot = self.done.wait(slot).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        drop(slot);
                        let outcome = Outcome::TimedOut(timeout.unwrap_or_default());
                        self.finish(outcome);
                        slot = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    slot = self
                        .done
                        .wait_timeout(slot, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
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
    ] {
        if !kvm.check_extension(cap) {
            return Err(Error::KvmCapability(name));
        }
    }
    Ok(kvm)
}

/// Boot and run one guest to its end. Console output goes to `console`.
pub fn run(config: &VmConfig, console: Box<dyn Write + Send>) -> Result<RunReport, Error> {
    if config.vcpus == 0 || config.vcpus as usize > protocol::MAX_VCPUS {
        return Err(Error::Config(format!(
            "--vcpus must be between 1 and {}, not {}",
            protocol::MAX_VCPUS,
            config.vcpus
        )));
    }
    if !config.mem_size.is_multiple_of(2 << 20) || config.mem_size > arch::abi::RAM_LIMIT {
        return Err(Error::Config(format!(
            "--mem must be a multiple of 2 MiB and at most {} MiB",
            arch::abi::RAM_LIMIT >> 20
        )));
    }
    let mut phases = Vec::new();
    let image = loader::inspect(&config.image, config.mem_size)?;
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
    // SAFETY: the region is `ram`'s mapping of `mem_size` bytes, which `VmShared` keeps alive
    // (and unmoved: the mmap does not move with the struct) until every vCPU thread is joined
    // and the VM fd is closed.
    unsafe { vm.set_user_memory_region(region) }
        .map_err(Error::kvm("KVM_SET_USER_MEMORY_REGION"))?;

    phases.push(("VM created, guest RAM mapped", rdtsc()));
    // After the memory slot: with an irqchip present, adding the slot costs 6-12 ms instead of
    // 0.2 ms for 256 MiB on our KVM. (The cost moves to VM teardown, after the guest ran.)
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

    vcpu::install_kick_handler()?;
    let shared = Arc::new(VmShared {
        ram,
        plan,
        vcpus: (0..config.vcpus).map(|_| VcpuControl::default()).collect(),
        outcome: Mutex::new(None),
        done: Condvar::new(),
        running: AtomicUsize::new(config.vcpus as usize),
        console: Mutex::new(console),
    });
    let mut threads = Vec::new();
    for (index, fd) in fds.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || vcpu::run_vcpu(fd, index as u32, shared))
            .map_err(|e| Error::Host(format!("cannot start a vCPU thread: {e}")))?;
        threads.push(thread);
    }
    phases.push(("vCPU threads started", rdtsc()));

    let outcome = shared.wait(config.timeout);
    for thread in threads {
        if thread.join().is_err() {
            return Err(Error::Host("a vCPU thread panicked".into()));
        }
    }
    let timing = config
        .boot_timing
        .then(|| boot_timing(&shared, config, tsc_khz, phases));
    let exits = shared
        .vcpus
        .iter()
        .map(|v| {
            let n = |i: usize| v.exits[i].load(Ordering::Relaxed);
            (
                n(vcpu::EXIT_HYPERCALL),
                n(vcpu::EXIT_KICK),
                n(vcpu::EXIT_OTHER),
            )
        })
        .collect();
    Ok(RunReport {
        outcome,
        timing,
        exits,
    })
}

fn boot_timing(
    shared: &VmShared,
    config: &VmConfig,
    tsc_khz: u64,
    phases: Vec<(&'static str, u64)>,
) -> BootTiming {
    let vcpus_field = std::mem::offset_of!(protocol::boot::BootInfo, vcpus) as u64;
    let vcpus = (0..config.vcpus as u64)
        .map(|i| {
            let at = arch::layout::BOOT_INFO_ADDR
                + vcpus_field
                + i * std::mem::size_of::<VcpuBoot>() as u64;
            let first = shared
                .ram
                .read_u64(at + std::mem::offset_of!(VcpuBoot, first_insn_tsc) as u64);
            let main = shared
                .ram
                .read_u64(at + std::mem::offset_of!(VcpuBoot, main_tsc) as u64);
            (first.unwrap_or(0), main.unwrap_or(0))
        })
        .collect();
    BootTiming {
        tsc_khz,
        process_start: config.start_tsc,
        phases,
        vcpus,
    }
}
