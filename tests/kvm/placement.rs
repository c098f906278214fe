//! Where the vCPU threads may run on the host: a guest alone may use all its processors' CPUs;
//! beside a latency-critical guest the others' vCPU threads run at the host's idle priority.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};

use super::{guest, TempDir, ACTIVM};

/// Linux's `SCHED_IDLE` policy number.
const SCHED_IDLE: u32 = 5;

/// The scheduling policy (`/proc/.../stat` field 41) of each vCPU thread of process `pid`, by
/// thread name, sorted.
fn vcpu_policies(pid: u32) -> Vec<(String, u32)> {
    let mut rows = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return rows;
    };
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // Fields after the parenthesized name start at field 3.
        let policy = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(41 - 3))
            .and_then(|f| f.parse().ok());
        if let (true, Some(policy)) = (name.contains("-vcpu"), policy) {
            rows.push((name.trim().to_string(), policy));
        }
    }
    rows.sort();
    rows
}

/// Runs a latency-critical N-body guest (`g0`) beside a batch one (`g1`), 2 vCPUs each, with
/// `machine` at the top of the file; returns the vCPU threads' policies once they are
/// `expected` (a thread sets its own as it starts), or as they are after 2.5 s.
fn policies_beside_a_critical_guest(
    machine: &str,
    expected: &[(String, u32)],
) -> Result<Vec<(String, u32)>, Failed> {
    let dir = TempDir::new("sched-idle")?;
    dir.link_guest("nbody")?;
    let guest = "image = \"nbody\"\nvcpus = 2\nargs = [\"nbody-for\", \"256\", \"3000\", \"2\"]\n";
    let file = dir.file(
        "beside.toml",
        &format!(
            "pcpus = 2\ntimeout = 60\n{machine}\n[[guest]]\nname = \"critical\"\n\
             latency_critical = true\n{guest}\n[[guest]]\nname = \"batch\"\n{guest}"
        ),
    )?;
    let mut child = Command::new(ACTIVM)
        .arg("run")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut seen = Vec::new();
    while started.elapsed() < Duration::from_millis(2500) && seen != expected {
        std::thread::sleep(Duration::from_millis(50));
        seen = vcpu_policies(child.id());
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(seen)
}

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
    vec![
        Trial::test(
            "batch_guests_beside_a_latency_critical_one_run_at_the_host_idle_priority",
            || {
                // Under the allocator by default; under host_sched only when asked (what a
                // plain KVM user does with `chrt --idle`); never for the critical guest.
                let idle_batch = |critical: u32| {
                    vec![
                        ("g0-vcpu0".to_string(), critical),
                        ("g0-vcpu1".to_string(), critical),
                        ("g1-vcpu0".to_string(), SCHED_IDLE),
                        ("g1-vcpu1".to_string(), SCHED_IDLE),
                    ]
                };
                let all_normal: Vec<_> = idle_batch(0).into_iter().map(|(n, _)| (n, 0)).collect();
                for (machine, expected) in [
                    ("", idle_batch(0)),
                    ("batch_sched_idle = false\n", all_normal.clone()),
                    ("host_sched = true\n", all_normal.clone()),
                    (
                        "host_sched = true\nbatch_sched_idle = true\n",
                        idle_batch(0),
                    ),
                ] {
                    let seen = policies_beside_a_critical_guest(machine, &expected)?;
                    if seen != expected {
                        return Err(format!(
                            "with {machine:?}: policies {seen:?}, expected {expected:?}"
                        )
                        .into());
                    }
                }
                Ok(())
            },
        ),
        Trial::test(
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
                    Err(format!(
                        "vCPU threads' CPUs after 2.5 s: {seen:?}; expected one set of all"
                    )
                    .into())
                }
            },
        ),
    ]
}
