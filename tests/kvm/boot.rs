//! Guests that boot, print and exit: SMP boot, the demo, the selftest's cases, faults and exit codes.

use std::process::Command;

use activm::testing::{raw_guest, TRIPLE_FAULT_CODE};
use libtest_mimic::{Failed, Trial};

use super::{
    activm_run, demo_smp, guest, rt_suite_exact, selftest, temp_image, Run, Setup, ACTIVM,
};

pub(super) fn kvm_tests() -> Vec<Trial> {
    let mut trials: Vec<Trial> = [1u32, 2, 4, 8]
        .into_iter()
        .map(|n| Trial::test(format!("smp_boot_{n}_vcpus"), move || demo_smp(n)))
        .collect();
    trials.extend([
        Trial::test("exit_code_is_passed_through", || {
            selftest(&[], &["exit", "7"])?.expect_code(7)?;
            selftest(&[], &["exit", "0"])?.expect_code(0)?;
            selftest(&[], &["exit", "300"])?.expect_code(300 & 0xff)?;
            Ok(())
        }),
        Trial::test("guest_panic_is_reported", || {
            selftest(&[], &["panic"])?
                .expect_code(101)?
                .stderr_has("guest panicked on vCPU 0")?
                .stderr_has("selftest panic on purpose")?;
            Ok(())
        }),
        Trial::test("guest_code_runs_at_cpl3", || {
            selftest(&["--vcpus", "2"], &["cpl"])?
                .expect_code(0)?
                .stdout_has("vcpu 0 cpl=3")?
                .stdout_has("vcpu 1 cpl=3")?;
            // A privileged instruction in guest code faults: it really is CPL3.
            selftest(&[], &["privileged"])?
                .expect_code(125)?
                .stderr_has("#GP general protection")?
                .stderr_has("at CPL3")?;
            Ok(())
        }),
        Trial::test("null_dereference_is_a_page_fault", || {
            selftest(&[], &["null"])?
                .expect_code(125)?
                .stderr_has("#PF page fault")?
                .stderr_has("cr2=0x0")?
                .stderr_has("user read of an unmapped page")?;
            Ok(())
        }),
        Trial::test("triple_fault_is_reported_with_registers", || {
            let image = temp_image(
                "triple",
                &raw_guest(protocol::ABI_VERSION, TRIPLE_FAULT_CODE),
            )?;
            activm_run(&image, &[], &[])?
                .expect_code(125)?
                .stderr_has("triple fault")?
                .stderr_has("rip=0x0000000000200047")?;
            Ok(())
        }),
        Trial::test("unknown_hypercall_is_refused", || {
            selftest(&[], &["unknown-hypercall"])?
                .expect_code(125)?
                .stderr_has("unknown hypercall 511")?;
            Ok(())
        }),
        Trial::test("malformed_hypercalls_are_refused", || {
            selftest(&[], &["misaligned-hypercall"])?
                .expect_code(125)?
                .stderr_has("not 8-byte aligned")?;
            selftest(&[], &["store-hypercall"])?
                .expect_code(125)?
                .stderr_has("hypercalls are loads")?;
            selftest(&[], &["bad-pointer"])?
                .expect_code(125)?
                .stderr_has("malformed hypercall console_write")?
                .stderr_has("outside guest RAM")?;
            Ok(())
        }),
        Trial::test("floating_point_works_at_cpl3", || {
            selftest(&[], &["fp"])?
                .expect_code(0)?
                .stdout_has("1.644933")?;
            Ok(())
        }),
        Trial::test("smp_atomics_add_up", || {
            selftest(&["--vcpus", "4"], &["smp"])?
                .expect_code(0)?
                .stdout_has("smp total=4000000 expected=4000000")?;
            Ok(())
        }),
        Trial::test("guest_arguments_arrive", || {
            selftest(&[], &["args", "one", "two words"])?
                .expect_code(0)?
                .stdout_has("argc=3")?
                .stdout_has("arg[1]=one\n")?
                .stdout_has("arg[2]=two words\n")?;
            Ok(())
        }),
        Trial::test("heap_allocation_works", || {
            selftest(&["--mem", "64M"], &["heap"])?
                .expect_code(0)?
                .stdout_has("heap ok")?;
            Ok(())
        }),
        Trial::test("registers_survive_interrupt_storms", || {
            // Every GPR, xmm0-15 and MXCSR held across 100+ timer ticks and 500 IPIs from
            // the other vCPU, landing at random CPL3 instructions.
            selftest(&["--vcpus", "2"], &["irq-stress"])?
                .expect_code(0)?
                .stdout_has("irq-stress ok: ")?
                .stdout_has(" timer ticks, 500 IPIs, ")?;
            Ok(())
        }),
        Trial::test("cpl3_self_ipi_reaches_handler", || {
            selftest(&[], &["irq"])?
                .expect_code(0)?
                .stdout_has("irq ok")?;
            Ok(())
        }),
        Trial::test("timeout_stops_a_spinning_guest", || {
            let image = guest("selftest")?;
            let output = Command::new(ACTIVM)
                .args(["run", "--timeout", "1"])
                .arg(image)
                .args(["--", "spin"])
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output).expect_code(124)?.stderr_has("timeout")?;
            Ok(())
        }),
        Trial::test("boot_timing_is_reported", || {
            let run = activm_run(&guest("demo")?, &["--boot-timing", "--vcpus", "2"], &[])?
                .expect_code(0)?;
            let line = run
                .stderr
                .lines()
                .find(|l| l.contains("vCPU 0:") && l.contains("guest main"))
                .ok_or("no guest main line for vCPU 0 in --boot-timing output")?;
            let us: f64 = line
                .split_whitespace()
                .last()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("unparsable timing line {line:?}"))?;
            if !(us > 0.0 && us < 10_000_000.0) {
                return Err(format!("implausible boot time {us} us").into());
            }
            Ok(())
        }),
        Trial::test("prefault_faults_ram_in_before_boot", || {
            activm_run(
                &guest("demo")?,
                &[
                    "--prefault",
                    "--mem",
                    "64M",
                    "--boot-timing",
                    "--vcpus",
                    "2",
                ],
                &[],
            )?
            .expect_code(0)?
            .stderr_has("guest RAM faulted in")?;
            Ok(())
        }),
        Trial::test("place_vcpus_binds_granted_vcpu_threads", || {
            // By default every processor is one host CPU (the default --pcpus is every CPU
            // activm may use): each vCPU's thread is bound to its processor's CPU when first
            // granted one. `--no-place-vcpus` leaves them to Linux.
            let moved = |flags: &[&str]| -> Result<Option<u64>, Failed> {
                let mut args = vec!["--stats", "--vcpus", "4"];
                args.extend_from_slice(flags);
                let run = activm_run(&guest("rt-demo")?, &args, &[])?
                    .expect_code(0)?
                    .stdout_has("total 80000 (expected 80000)")?;
                Ok(run
                    .stderr
                    .split("vCPU threads moved to their processor's host CPU (all guests)=")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok()))
            };
            match (moved(&[])?, moved(&["--no-place-vcpus"])?) {
                (Some(on), Some(0)) if on >= 1 => Ok(()),
                other => Err(format!(
                    "threads moved (placement on, off): {other:?}; expected (>= 1, 0)"
                )
                .into()),
            }
        }),
        Trial::test("abi_version_mismatch_is_refused", || {
            let image = temp_image(
                "abi",
                &raw_guest(protocol::ABI_VERSION + 1, TRIPLE_FAULT_CODE),
            )?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has(&format!("speaks ABI v{}", protocol::ABI_VERSION))?;
            Ok(())
        }),
        Trial::test("memory_too_small_is_refused", || {
            selftest(&["--mem", "2M"], &["exit", "0"])?
                .expect_code(1)?
                .stderr_has("guest memory too small")?;
            selftest(&["--mem", "3M"], &["exit", "0"])?
                .expect_code(1)?
                .stderr_has("multiple of 2 MiB")?;
            Ok(())
        }),
    ]);
    // ---------------------------------------------------------------------------------------
    // activm-rt, the guest thread runtime (owner: the runtime engineer): rt-demo and the
    // in-guest suite rt-tests (one line per test, then "N passed, M failed"), on 1, 2 and 4
    // vCPUs, with the VMM's activations (default) and without (--no-activations: the runtime's
    // simulated VMM drives the upcall tests), plus the two modes that end the guest.
    for vcpus in [1u32, 2, 4] {
        trials.push(Trial::test(format!("rt_demo_{vcpus}_vcpus"), move || {
            let n = vcpus.to_string();
            activm_run(&guest("rt-demo")?, &["--vcpus", &n], &[])?
                .expect_code(0)?
                .stdout_has("total 80000 (expected 80000)")?;
            Ok(())
        }));
        trials.push(Trial::test(format!("rt_tests_{vcpus}_vcpus"), move || {
            let n = vcpus.to_string();
            let run = activm_run(&guest("rt-tests")?, &["--vcpus", &n], &[])?.expect_code(0)?;
            rt_suite_exact(run, Setup::new(true, vcpus, false), &[], "")?;
            Ok(())
        }));
        trials.push(Trial::test(
            format!("rt_tests_no_activations_{vcpus}_vcpus"),
            move || {
                let n = vcpus.to_string();
                let run = activm_run(
                    &guest("rt-tests")?,
                    &["--vcpus", &n, "--no-activations"],
                    &[],
                )?
                .expect_code(0)?;
                rt_suite_exact(run, Setup::new(false, vcpus, false), &[], "")?;
                Ok(())
            },
        ));
    }
    trials.extend([
        Trial::test("rt_tests_host_sched_4_vcpus", || {
            // Host-scheduled: every vCPU thread left to Linux, oblivious guests, nothing revoked.
            let run = activm_run(
                &guest("rt-tests")?,
                &["--vcpus", "4", "--host-sched", "--stats"],
                &[],
            )?
            .expect_code(0)?;
            rt_suite_exact(run, Setup::new(false, 4, false), &[], "")?;
            activm_run(&guest("rt-tests")?, &["--host-sched", "--chaos", "1"], &[])?
                .expect_code(2)?
                .stderr_has("--chaos")?;
            Ok(())
        }),
        Trial::test("rt_real_activations_hand_threads_over", || {
            let run = activm_run(&guest("rt-tests")?, &["--vcpus", "2"], &["sa-real"])?;
            rt_suite_exact(
                run.expect_code(0)?,
                Setup::new(true, 2, false),
                &["sa-real"],
                "",
            )?;
            Ok(())
        }),
        Trial::test("rt_allocation_chaos_keeps_threads_exact", || {
            // The guest itself revokes and grants processors every 0.1-2 ms under the stress
            // workload (random preemptions, locks, spawns, messages): counters stay exact.
            let run = activm_run(&guest("rt-tests")?, &["--vcpus", "2"], &["sa-chaos"])?;
            rt_suite_exact(
                run.expect_code(0)?,
                Setup::new(true, 2, false),
                &["sa-chaos"],
                "",
            )?;
            Ok(())
        }),
        Trial::test("rt_tests_unknown_name_is_an_error", || {
            // On one processor too, where sa-real and sa-chaos skip themselves: the unknown
            // name must not vanish behind a passing count.
            activm_run(
                &guest("rt-tests")?,
                &["--pcpus", "1"],
                &["sa-real", "sa-chaos", "mutex", "no-such-test"],
            )?
            .expect_code(2)?
            .stdout_has("rt-tests: no test named no-such-test (`rt-tests list` lists them)\n")?;
            let run = activm_run(&guest("rt-tests")?, &["--vcpus", "2"], &["mutex", "sem*"])?;
            rt_suite_exact(
                run.expect_code(0)?,
                Setup::new(true, 2, false),
                &["mutex", "semaphore"],
                "",
            )?;
            Ok(())
        }),
        Trial::test("rt_stack_overflow_is_caught_by_the_guard_page", || {
            activm_run(&guest("rt-tests")?, &["--vcpus", "2"], &["overflow"])?
                .expect_code(101)?
                .stderr_has("thread 'deep-recursion' overflowed its stack")?;
            Ok(())
        }),
        Trial::test("rt_thread_faults_are_reported_by_runtime_and_vmm", || {
            // The runtime's exception handler reports first, then the fault recurs with
            // exceptions fatal and the VMM ends the guest (aarch64: `cargo xtask aarch64-test`).
            activm_run(
                &guest("rt-tests")?,
                &["--vcpus", "2"],
                &["fault", "bad-access"],
            )?
            .expect_code(125)?
            .stdout_has(" exception 14 at pc ")?
            .stdout_has("fault address 0x8:")?
            .stderr_has("#PF page fault (vector 14) at CPL3")?;
            activm_run(
                &guest("rt-tests")?,
                &["--vcpus", "2"],
                &["fault", "undefined"],
            )?
            .expect_code(125)?
            .stdout_has(" exception 6 at pc ")?
            .stderr_has("#UD invalid opcode (vector 6) at CPL3")?;
            // Our hosts raise #UD for an MXCSR value with reserved bits (no retry: such a value
            // comes from a frame that was overwritten).
            activm_run(
                &guest("rt-tests")?,
                &["--vcpus", "2"],
                &["fault", "bad-mxcsr"],
            )?
            .expect_code(125)?
            .stdout_has("(MXCSR value 0xffffffff): the value has reserved bits")?
            .stderr_has("#UD invalid opcode (vector 6) at CPL3")?;
            Ok(())
        }),
        Trial::test("rt_exception_handler_context_stays_the_handler", || {
            // The simulated VMM takes a faulting thread while its handler reports: the context
            // is continued as the handler (it ended the guest with "would resume with stack
            // pointer ... outside its stack", status 101), and the fault ends the guest. On a
            // loaded host the handler can finish before a kick lands (about 1 run in 40): such
            // a run proves nothing, so up to 5 runs until one was taken in its handler.
            for _ in 0..5 {
                let run = activm_run(
                    &guest("rt-tests")?,
                    &["--vcpus", "2", "--no-activations"],
                    &["fault-handover"],
                )?
                .expect_code(125)?
                .stderr_has("#UD invalid opcode (vector 6) at CPL3")?;
                if run.stdout.contains("exception_contexts: 1") {
                    return Ok(());
                }
            }
            Err("in 5 runs the faulting thread was never taken in its handler".into())
        }),
        Trial::test("rt_thread_panic_names_the_thread", || {
            activm_run(&guest("rt-tests")?, &["--vcpus", "2"], &["panic"])?
                .expect_code(101)?
                .stderr_has("thread 'panicker' panicked")?
                .stderr_has("boom on purpose")?;
            Ok(())
        }),
    ]);
    // ---- end of activm-rt tests ----
    trials
}
