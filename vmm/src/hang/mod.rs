//! The hang report: what a guest looked like when the VMM stopped it without its ending by
//! itself (`--timeout`, a second host signal), in every mode (activations, the time slicer,
//! `--host-sched`).
//!
//! Before the guest is stopped, [`Guest::begin_hang_report`] keeps each vCPU's allocator slot
//! and the upcall state. Each vCPU thread, on its way out, then records where it was stopped
//! (running guest code, waiting for a processor, ...), whether KVM held it halted, and its
//! registers and pending interrupts ([`state::VcpuSnapshot`]; only that thread may ask KVM). Once
//! every vCPU thread is joined, [`Guest::hang_report`] puts it together with the guest
//! runtime's threads and run queues, read from guest memory (`runtime_view.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::guest::Guest;
use crate::runtime_view;

pub mod state;

use state::{Before, RUNNING};

/// How long the report watches the vCPU threads' host CPU time before the guest is stopped: a
/// vCPU that looks stuck (a timer long overdue, an interrupt requested and not taken) while
/// its thread runs is the host's KVM not delivering; one whose thread does not run is waiting
/// for a host CPU.
const CPU_SAMPLE: Duration = Duration::from_millis(50);

impl Guest {
    /// The guest is about to be stopped without ending by itself (`why`): keep what only the
    /// running guest shows (its allocator slots, its upcall state), and have each vCPU thread
    /// take a snapshot on its way out. Call before [`Guest::finish`]; only the first call counts.
    pub fn begin_hang_report(&self, why: &str) {
        if self.outcome().is_some() {
            return;
        }
        if self.hang.before.lock().map_or(true, |b| b.is_some()) {
            return;
        }
        let cpu = || {
            self.vcpus
                .iter()
                .map(|c| c.thread_cpu_time())
                .collect::<Vec<_>>()
        };
        let start = cpu();
        std::thread::sleep(CPU_SAMPLE);
        let ran = start
            .into_iter()
            .zip(cpu())
            .map(|(a, b)| Some(b?.saturating_sub(a?)))
            .collect();
        let mut before = self.hang.before.lock().unwrap_or_else(|e| e.into_inner());
        if before.is_some() {
            return;
        }
        let view = self.procs.alloc.view(self.id);
        *before = Some(Before {
            ran,
            why: why.to_string(),
            slots: view.vcpus.iter().map(|slot| format!("{slot:?}")).collect(),
            upcalls: self
                .acts
                .enabled()
                .then(|| self.acts.describe(self.shared())),
        });
        self.hang.wanted.store(true, Ordering::Release);
    }

    /// The report, once every vCPU thread has stopped (`None` if none was begun).
    pub fn hang_report(&self) -> Option<String> {
        let before = self.hang.before.lock().unwrap_or_else(|e| e.into_inner());
        let before = before.as_ref()?;
        let mut out = format!(
            "hang report ({}): {} vCPUs, {}\n",
            before.why,
            self.vcpus.len(),
            if self.acts.enabled() {
                "taking upcalls (activations)"
            } else {
                "oblivious (no upcalls)"
            }
        );
        for (i, control) in self.vcpus.iter().enumerate() {
            let slot = before.slots.get(i).map_or("?", String::as_str);
            let ran = match before.ran.get(i).copied().flatten() {
                Some(t) => format!(
                    "; its thread ran {:.1} ms of the last {} ms before the stop",
                    t.as_secs_f64() * 1e3,
                    CPU_SAMPLE.as_millis()
                ),
                None => String::new(),
            };
            match control.snapshot() {
                Some(s) => {
                    out += &format!(
                        "vCPU {i}: {}, {}; allocator slot {slot}{ran}{}\n{}\n",
                        s.place,
                        match s.halted {
                            Some(true) => "halted in KVM",
                            Some(false) => "not halted",
                            None => "halt state unknown",
                        },
                        if s.place == RUNNING {
                            ""
                        } else {
                            "; its registers as it last ran:"
                        },
                        s.registers
                    );
                }
                None => out += &format!("vCPU {i}: no snapshot; allocator slot {slot}{ran}\n"),
            }
        }
        if let Some(upcalls) = &before.upcalls {
            out += &format!("upcalls: {upcalls}\n");
        }
        let context = runtime_view::Context {
            table: self.shared().runtime_diag(),
            nr_vcpus: self.vcpus.len() as u32,
            image: self.plan.image.clone(),
            now_tsc: crate::arch::current::timestamp(),
            tsc_khz: self.tsc_khz,
            max_tcbs: runtime_view::MAX_TCBS,
        };
        out += &runtime_view::describe(&self.ram, &context);
        Some(out)
    }
}
