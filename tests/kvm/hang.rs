//! The hang report (`vmm/src/hang/`): a guest that deadlocks is stopped by `--timeout` with
//! status 124, and the report names every vCPU's state and registers and the stuck threads,
//! in every mode (activations, oblivious on its own processors, the time slicer, host-scheduled).

use libtest_mimic::{Failed, Trial};

use super::{activm_run_within, guest};

/// (test name, activm options, vCPUs)
const MODES: [(&str, &[&str], u32); 4] = [
    (
        "timeout_reports_a_hung_guest_with_activations",
        &["--vcpus", "2"],
        2,
    ),
    (
        "timeout_reports_a_hung_guest_oblivious",
        &["--vcpus", "2", "--no-activations"],
        2,
    ),
    (
        "timeout_reports_a_hung_guest_time_sliced",
        &["--vcpus", "3", "--pcpus", "1", "--no-activations"],
        3,
    ),
    (
        "timeout_reports_a_hung_guest_host_sched",
        &["--vcpus", "4", "--host-sched"],
        4,
    ),
];

pub fn tests() -> Vec<Trial> {
    let mut trials: Vec<Trial> = MODES
        .iter()
        .map(|&(name, options, vcpus)| Trial::test(name, move || hung(options, vcpus)))
        .collect();
    for (name, options) in [
        (
            "watchdog_ends_the_guest_when_its_report_is_lost_with_activations",
            &["--vcpus", "2"][..],
        ),
        (
            "watchdog_ends_the_guest_when_its_report_is_lost_oblivious",
            &["--vcpus", "2", "--no-activations"][..],
        ),
        // No other vCPU: the one running the report must end the guest itself (its own timer,
        // armed for the grace, interrupts the report). So must it with 2 vCPUs when the other
        // runs threads with no timer armed (CI, 2026-11-28: 124 at --timeout).
        (
            "watchdog_ends_the_guest_when_its_report_is_lost_on_one_vcpu",
            &["--vcpus", "1"][..],
        ),
    ] {
        trials.push(Trial::test(name, move || lost_report(options)));
    }
    trials
}

/// The runtime's watchdog (tests) fires and the context printing its report never reaches
/// its `exit` (the VMM can drop that context: `guest-runtime/src/watchdog.rs`): a vCPU ends
/// the guest with the watchdog's status 99 within seconds, not the guest's own 20 s wait
/// (status 1) or `--timeout` (124).
fn lost_report(options: &[&str]) -> Result<(), Failed> {
    activm_run_within(
        "40",
        &guest("rt-tests")?,
        options,
        &["watchdog-lost-report"],
    )?
    .expect_code(99)?
    .stdout_has("watchdog-lost-report: arming the watchdog")?
    .stdout_has("activm-rt: watchdog: its report did not end the guest within 5 s")?;
    Ok(())
}

fn hung(options: &[&str], vcpus: u32) -> Result<(), Failed> {
    let run = activm_run_within("3", &guest("rt-tests")?, options, &["deadlock"])?
        .expect_code(124)?
        .stdout_has("deadlock: deadlock-a and deadlock-b wait for each other")?
        .stderr_has("guest still running after the 3s timeout; stopped")?
        .stderr_has("activm: hang report (--timeout 3s): ")?;
    let lines: Vec<&str> = run.stderr.lines().collect();
    let has = |prefix: &str, what: &[&str]| {
        lines
            .iter()
            .any(|l| l.starts_with(prefix) && what.iter().all(|w| l.contains(w)))
    };
    for v in 0..vcpus {
        let places = [
            "running guest code",
            "waiting for a processor",
            "given back by the guest",
            "starting a new activation",
        ];
        let vcpu = format!("activm: vCPU {v}: ");
        let line = lines
            .iter()
            .find(|l| l.starts_with(&vcpu))
            .ok_or(format!("no report line for vCPU {v}:\n{}", run.stderr))?;
        if !places.iter().any(|p| line.contains(p))
            || !(line.contains("halted in KVM") || line.contains("not halted"))
        {
            return Err(format!("vCPU {v}'s line names no place or halt state: {line}").into());
        }
        if !has(
            &format!("activm: runtime vCPU {v}: "),
            &["timer", "run queue"],
        ) {
            return Err(format!("no runtime line for vCPU {v}:\n{}", run.stderr).into());
        }
    }
    let registers = lines
        .iter()
        .filter(|l| l.contains(" rip=") || l.contains(" pc="))
        .count();
    if registers != vcpus as usize {
        return Err(format!(
            "{registers} register dumps for {vcpus} vCPUs:\n{}",
            run.stderr
        )
        .into());
    }
    for thread in [
        "'deadlock-a': blocked (parked)",
        "'deadlock-b': blocked (parked)",
        "'main' (main): blocked (parked)",
    ] {
        if !has("activm: thread #", &[thread, "code addresses on its stack"]) {
            return Err(format!("no line \"{thread}\" in the report:\n{}", run.stderr).into());
        }
    }
    run.stderr_has("activm: runtime: 3 live threads (3 listed above, 0 not)")?;
    Ok(())
}
