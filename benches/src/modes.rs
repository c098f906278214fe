//! The three ways a benchmark runs the same guests, on the same host CPUs, in the same run:
//! with scheduler activations, host-scheduled (plain KVM: one host thread per vCPU, left to
//! Linux's scheduler; what a KVM user runs instead) and under activm's own time slicer
//! (oblivious guests, the allocator rotating vCPUs over the processors).

use activm::MonitorOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Activations,
    HostSched,
    TimeSlicer,
}

impl Mode {
    /// In the order the tables print them: activations, then the headline baseline.
    pub const ALL: [Mode; 3] = [Mode::Activations, Mode::HostSched, Mode::TimeSlicer];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Activations => "activations",
            Mode::HostSched => "host-sched",
            Mode::TimeSlicer => "time slicer",
        }
    }

    /// The `activm run` flags of this mode.
    pub fn flags(self) -> &'static str {
        match self {
            Mode::Activations => "--pcpus P",
            Mode::HostSched => "--host-sched",
            Mode::TimeSlicer => "--no-activations --pcpus P",
        }
    }

    /// Monitor options for this mode on `pcpus` processors (host-scheduled ignores `pcpus`:
    /// the CPU set the benchmark pinned itself to bounds it).
    pub fn options(self, pcpus: usize) -> MonitorOptions {
        MonitorOptions {
            pcpus,
            activations: self == Mode::Activations,
            host_sched: self == Mode::HostSched,
            // The allocator's modes place granted vCPUs on host CPUs (never host-sched).
            place_vcpus: self != Mode::HostSched,
            ..MonitorOptions::default()
        }
    }
}

/// Confine this process (and every thread it starts later, vCPU threads included) to the first
/// `n` CPUs it may run on, so all modes share one CPU set and a larger machine gives comparable
/// numbers. Returns the CPUs, or why not.
pub fn pin_to_cpus(n: usize) -> Result<Vec<usize>, String> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes for the kernel to fill.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: CPU_ISSET reads the set in bounds (i < CPU_SETSIZE).
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect();
    if allowed.len() < n {
        return Err(format!("only {} CPUs available, {n} needed", allowed.len()));
    }
    let chosen = allowed[..n].to_vec();
    // SAFETY: as above, zeroed is the empty set.
    let mut pinned: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in &chosen {
        // SAFETY: cpu < CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut pinned) };
    }
    // SAFETY: `pinned` is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_setaffinity(0, size, &pinned) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(chosen)
}

/// Pin to `n` CPUs and say so (or why not) in the benchmark's output.
pub fn pin_and_report(n: usize) {
    match pin_to_cpus(n) {
        Ok(cpus) => println!("pinned to host CPUs {cpus:?} (every mode runs on these)"),
        Err(why) => println!("not pinned ({why}): modes share whatever CPUs the host gives"),
    }
}
