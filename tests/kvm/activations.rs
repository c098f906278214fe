//! Scheduler activations end to end: upcalls counted, signals, the control socket.

use std::process::Command;

use activm::testing::TempPath;
use libtest_mimic::{Failed, Trial};

use super::{activm_run, exact, guest, selftest, Run, ACTIVM, GUEST_TIMEOUT_SECS};

/// Scheduler activations, the allocator and the host-facing services, end to end.
pub(super) fn activation_tests() -> Vec<Trial> {
    vec![
        Trial::test("activations_preempt_hand_off_newproc_user", || {
            // One vCPU loses its processor: its context reaches the other vCPU in a PREEMPTED
            // record, comes back as a new activation (NEWPROC) that resumes it, then gets a
            // USER upcall. The guest checks every record (selftest/src/sa.rs).
            selftest(&["--vcpus", "2", "--pcpus", "2", "--stats"], &["sa"])?
                .expect_code(0)?
                .stdout_has("sa ok")?
                .stdout_has("resumed on activation")?
                .stderr_has("NEWPROC=1 PREEMPTED=1")?
                .stderr_has("USER=1")?
                .stderr_has("preemption latency")?;
            Ok(())
        }),
        Trial::test("no_activations_mode_refuses_upcalls", || {
            selftest(&["--vcpus", "2", "--no-activations"], &["sa"])?
                .expect_code(3)?
                .stdout_has("activations unsupported")?;
            Ok(())
        }),
        Trial::test("two_guests_time_slice_one_pcpu", || {
            // Each demo's vCPU 0 waits for its vCPU 1: with one processor for four vCPUs,
            // only time slicing lets them finish.
            let demo = guest("demo")?;
            let output = Command::new(ACTIVM)
                .args([
                    "run",
                    "--timeout",
                    GUEST_TIMEOUT_SECS,
                    "--vcpus",
                    "2",
                    "--pcpus",
                    "1",
                    "--stats",
                ])
                .arg(&demo)
                .arg(&demo)
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output)
                .expect_code(0)?
                .stdout_has("[demo#0] all 2 vCPUs reported")?
                .stdout_has("[demo#1] all 2 vCPUs reported")?
                .stderr_has("descheduled (oblivious)=")?;
            Ok(())
        }),
        Trial::test("hostile_shared_area_stops_only_that_guest", || {
            let output = Command::new(ACTIVM)
                .args([
                    "run",
                    "--timeout",
                    GUEST_TIMEOUT_SECS,
                    "--vcpus",
                    "2",
                    "--pcpus",
                    "4",
                ])
                .arg(guest("selftest")?)
                .arg(guest("demo")?)
                .args(["--", "sa-hostile"])
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output)
                .expect_code(125)?
                .stdout_has("[demo] all 2 vCPUs reported")?
                .stderr_has("[selftest] guest fault")?
                .stderr_has("does not consume its upcalls")?
                .stderr_has("[demo] exit status 0")?;
            Ok(())
        }),
        Trial::test("sigint_reaches_the_guest_as_an_upcall", || {
            let run = run_and_signal(
                &["--timeout", GUEST_TIMEOUT_SECS],
                &["sa-signal"],
                Some("waiting"),
                libc::SIGINT,
            )?;
            run.expect_code(0)?
                .stdout_has("got signal 2, shutting down cleanly")?;
            Ok(())
        }),
        Trial::test("sigterm_stops_an_oblivious_guest", || {
            let run = run_and_signal(
                &["--timeout", GUEST_TIMEOUT_SECS],
                &["spin"],
                None,
                libc::SIGTERM,
            )?;
            run.expect_code(128 + libc::SIGTERM)?
                .stderr_has("stopped by signal 15")?;
            Ok(())
        }),
        Trial::test(
            "sigterm_ends_a_runtime_guest_quietly_and_sigquit_prints_its_state",
            sigterm_and_sigquit,
        ),
        Trial::test("control_socket_lists_and_changes_budget", control_socket),
        Trial::test(
            "control_socket_removes_and_adds_vcpus",
            control_socket_add_remove,
        ),
        Trial::test("defer_preemption_hint_is_honoured", defer_preemption_hint),
        Trial::test(
            "chaos_budget_changes_keep_an_oblivious_guest_correct",
            || {
                selftest(
                    &["--vcpus", "4", "--pcpus", "2", "--chaos", "7", "--stats"],
                    &["smp"],
                )?
                .expect_code(0)?
                .stdout_has("smp total=4000000 expected=4000000")?;
                Ok(())
            },
        ),
        Trial::test("trace_file_is_chrome_json", || {
            let path = TempPath::new("trace.json");
            activm_run(
                &guest("demo")?,
                &["--vcpus", "2", "--trace", path.to_str().ok_or("path")?],
                &[],
            )?
            .expect_code(0)?;
            let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
            exact::check_trace(&text, "demo", 2)
        }),
    ]
}

/// Start selftest with `guest_args`, wait until it prints `ready` on stdout (or half a second
/// when `ready` is `None`), send `signal`, collect the run.
fn run_and_signal(
    options: &[&str],
    guest_args: &[&str],
    ready: Option<&str>,
    signal: i32,
) -> Result<Run, Failed> {
    run_image_and_signal("selftest", options, guest_args, ready, signal)
}

/// [`run_and_signal`] with the guest `image`.
fn run_image_and_signal(
    image: &str,
    options: &[&str],
    guest_args: &[&str],
    ready: Option<&str>,
    signal: i32,
) -> Result<Run, Failed> {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    use std::time::Duration;
    let mut child = Command::new(ACTIVM)
        .arg("run")
        .arg(guest(image)?)
        .args(options)
        .arg("--")
        .args(guest_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let out_thread = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            text += &line;
            text.push('\n');
            let _ = lines_tx.send(line);
        }
        text
    });
    let err_thread = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    match ready {
        Some(marker) => loop {
            match lines_rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line.contains(marker) => break,
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    return Err(format!("the guest never printed {marker:?}").into());
                }
            }
        },
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let status = child.wait().map_err(|e| e.to_string())?;
    Ok(Run {
        code: status.code().unwrap_or(-1),
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
    })
}

/// A runtime guest without a signal handler (rt-demo, busy on 2 vCPUs): SIGTERM ends it with
/// 143 and one line, SIGQUIT with 131 after the runtime's state (Go's convention).
fn sigterm_and_sigquit() -> Result<(), Failed> {
    let options = [
        "--timeout",
        GUEST_TIMEOUT_SECS,
        "--vcpus",
        "2",
        "--pcpus",
        "2",
    ];
    let busy = ["4", "1000000000000"];
    let state = "activm-rt: vCPU 0: activation";
    let run = run_image_and_signal("rt-demo", &options, &busy, None, libc::SIGTERM)?
        .expect_code(128 + libc::SIGTERM)?
        .stdout_has("activm-rt: signal 15, exiting")?;
    if run.stdout.contains(state) {
        return Err(format!("SIGTERM printed the runtime's state:\n{}", run.stdout).into());
    }
    run_image_and_signal("rt-demo", &options, &busy, None, libc::SIGQUIT)?
        .expect_code(128 + libc::SIGQUIT)?
        .stdout_has("activm-rt: signal 3 (SIGQUIT)")?
        .stdout_has(state)?
        .stdout_has("activm-rt stats:")?
        .stderr_has("activm: SIGQUIT received")?;
    Ok(())
}

/// A running activation guest loses a vCPU (PREEMPTED) and gets it back (NEWPROC) through
/// `activm ctl set-vcpus`, which reports how long each change took to be carried out.
fn control_socket_add_remove() -> Result<(), Failed> {
    // The VMM removes its socket when it exits normally; the guard covers the other endings.
    let socket = TempPath::new("ar.sock");
    let child = Command::new(ACTIVM)
        .arg("run")
        .arg(guest("selftest")?)
        .args([
            "--timeout",
            GUEST_TIMEOUT_SECS,
            "--vcpus",
            "2",
            "--pcpus",
            "2",
            "--stats",
            "--ctl",
        ])
        .arg(&socket)
        .args(["--", "sa-spin", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let ctl = |args: &[&str]| -> Result<Run, Failed> {
        let output = Command::new(ACTIVM)
            .arg("ctl")
            .arg(&socket)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        Ok(Run::from(output))
    };
    let wait_for = |needle: &str| -> Result<(), Failed> {
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            if ctl(&["list"])?.stdout.contains(needle) {
                return Ok(());
            }
        }
        Err(format!("activm ctl list never showed {needle}").into())
    };
    let result = (|| -> Result<(), Failed> {
        wait_for("\"activations\": true")?;
        ctl(&["set-vcpus", "0", "1"])?
            .expect_code(0)?
            .stdout_has("\"applied_us\"")?;
        wait_for("\"parked\"")?;
        ctl(&["set-vcpus", "0", "2"])?
            .expect_code(0)?
            .stdout_has("\"previous\": 1")?;
        wait_for("\"running\",\n        \"running\"")?;
        Ok(())
    })();
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    result?;
    Run::from(output)
        .expect_code(0)?
        .stderr_has("NEWPROC=1 PREEMPTED=1")?;
    Ok(())
}

fn control_socket() -> Result<(), Failed> {
    // The guest is killed below (SIGKILL), so the VMM never removes its socket: the guard does.
    let socket = TempPath::new("ctl.sock");
    let mut child = Command::new(ACTIVM)
        .arg("run")
        .arg(guest("selftest")?)
        .args(["--timeout", GUEST_TIMEOUT_SECS, "--vcpus", "2", "--ctl"])
        .arg(&socket)
        .args(["--", "spin"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let ctl = |args: &[&str]| -> Result<Run, Failed> {
        let output = Command::new(ACTIVM)
            .arg("ctl")
            .arg(&socket)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        Ok(Run::from(output))
    };
    let mut listed = None;
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let run = ctl(&["list"])?;
        if run.code == 0 && run.stdout.contains("\"stopped\"") {
            listed = Some(run);
            break;
        }
    }
    let result = (|| -> Result<(), Failed> {
        let listed = listed.ok_or("activm ctl list never showed the guest with vCPU 1 stopped")?;
        listed
            .stdout_has("\"name\": \"selftest\"")?
            .stdout_has("\"running\"")?;
        ctl(&["set-pcpus", "1"])?
            .expect_code(0)?
            .stdout_has("\"pcpus\": 1")?;
        ctl(&["list"])?.expect_code(0)?.stdout_has("\"pcpus\": 1")?;
        ctl(&["set-vcpus", "7", "1"])?
            .expect_code(1)?
            .stdout_has("needs \\\"guest\\\"")?;
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The victim yields at its safe point and no PREEMPTED record arrives. The VMM's grace is
/// 100 us: on a loaded host the victim's thread may not run that soon, and the VMM then takes
/// the processor (the guest exits 3). Such a run, with its deferral counted, is tried again,
/// at most twice; on a quiet host the first run passes.
fn defer_preemption_hint() -> Result<(), Failed> {
    let mut attempt = 1;
    loop {
        let run = selftest(&["--vcpus", "2", "--pcpus", "2", "--stats"], &["sa-defer"])?;
        if run.code == 3 && attempt < 3 {
            run.stdout_has("the grace ran out")?
                .stderr_has("deferred=1")?;
            eprintln!("sa-defer, run {attempt}: the victim did not run within the grace; again");
            attempt += 1;
            continue;
        }
        run.expect_code(0)?
            .stdout_has("sa-defer ok")?
            .stderr_has("PREEMPTED=0")?
            .stderr_has("deferred=1")?;
        return Ok(());
    }
}
