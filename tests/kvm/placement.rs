//! Where the vCPU threads may run on the host: a guest alone may use all its processors' CPUs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use super::{guest, ACTIVM};

/// The `Cpus_allowed_list` of each vCPU thread (`g0-vcpuN`) of process `pid`, by name.
fn vcpu_cpu_lists(pid: u32) -> Vec<(String, String)> {
    let mut lists: Vec<_> = super::thread_status_field(pid, "Cpus_allowed_list:")
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| name.starts_with("g0-vcpu"))
        .collect();
    lists.sort();
    lists
}

pub(super) fn tests() -> Vec<Trial> {
    vec![Trial::test(
        "place_vcpus_lets_a_guest_alone_run_its_threads_on_all_its_cpus",
        || {
            // Every vCPU busy (N-body, a thread each) and no other guest: once running, each vCPU
            // thread may run on the CPUs of all its guest's processors (one CPU each before: a
            // host process beside the guest then shared the busy vCPU's CPU).
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if cpus < 2 {
                eprintln!("placement: one host CPU, nothing to share");
                return Ok(());
            }
            let vcpus = cpus.min(8).to_string();
            let mut child = Command::new(ACTIVM)
                .arg("run")
                .arg(guest("nbody")?)
                .args(["--vcpus", &vcpus, "--timeout", "60", "--"])
                .args(["nbody-for", "256", "3000", &vcpus])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            // One set, of more than one CPU, for every vCPU thread.
            let shared = |lists: &[(String, String)]| {
                lists.len() == cpus.min(8)
                    && lists
                        .iter()
                        .all(|(_, l)| *l == lists[0].1 && l.contains(['-', ',']))
            };
            let mut seen = Vec::new();
            while started.elapsed() < Duration::from_millis(2500) && !shared(&seen) {
                std::thread::sleep(Duration::from_millis(50));
                seen = vcpu_cpu_lists(child.id());
            }
            let _ = child.kill();
            let _ = child.wait();
            if shared(&seen) {
                Ok(())
            } else {
                Err(
                    format!("vCPU threads' CPUs after 2.5 s: {seen:?}; expected one set of all")
                        .into(),
                )
            }
        },
    )]
}
