//! The cases `cargo xtask aarch64-test` runs in the arm64 machine (the kind is `case::Case`):
//! the runtime, block and scale cases here, the apps', the hostile guests' and the std guests'
//! in their own files.

use super::case::{upcalls, Case};
use super::{app_cases, hostile_cases, std_cases};

/// `activm run OPTIONS --disk /tmp/NAME.img -- GUEST_ARGS` on a fresh zeroed 4 MiB disk;
/// afterwards, with the status kept, the bytes the block tests leave at sector 5 offset 17 and
/// sector 511 offset 511 (`disk bytes: 236 24` when they wrote their pattern).
fn with_disk(name: &str, options: &str, guest_args: &str) -> String {
    let disk = format!("/tmp/{name}.img");
    let byte = |at: u32| format!("$(od -An -tu1 -j {at} -N 1 {disk} | tr -d ' ')");
    format!(
        "dd if=/dev/zero of={disk} bs=1M count=4 2>/dev/null; /activm run {options} --disk {disk} -- {guest_args}; \
         s=$?; echo \"disk bytes: {} {}\"; (exit $s)",
        byte(5 * 512 + 17),
        byte(511 * 512 + 511)
    )
}

/// Threads blocked in the VMM came back: BLOCKED records, as many UNBLOCKED ones.
fn blocked_and_unblocked(output: &str) -> Result<(), String> {
    let blocked = upcalls(output, "BLOCKED").unwrap_or(0);
    let unblocked = upcalls(output, "UNBLOCKED").unwrap_or(0);
    if blocked < 40 || blocked != unblocked {
        return Err(format!(
            "{blocked} BLOCKED and {unblocked} UNBLOCKED upcalls"
        ));
    }
    Ok(())
}

/// Asynchronous requests never block a vCPU.
fn never_blocked(output: &str) -> Result<(), String> {
    match upcalls(output, "BLOCKED") {
        Some(0) => Ok(()),
        n => Err(format!("BLOCKED={n:?} with asynchronous requests")),
    }
}

/// The chaos soak saw preemptions and blocking, and every BLOCKED came back.
fn soak_counts(output: &str) -> Result<(), String> {
    let preempted = upcalls(output, "PREEMPTED").unwrap_or(0);
    let blocked = upcalls(output, "BLOCKED").unwrap_or(0);
    let unblocked = upcalls(output, "UNBLOCKED").unwrap_or(0);
    if preempted < 10 || blocked < 10 || blocked != unblocked {
        return Err(format!(
            "{preempted} PREEMPTED, {blocked} BLOCKED, {unblocked} UNBLOCKED upcalls"
        ));
    }
    Ok(())
}

pub(super) fn cases() -> Vec<Case> {
    let mut hello: Vec<String> = (0..4)
        .map(|i| format!("hello from vCPU {i} of 4 at EL0"))
        .collect();
    hello.push("all 4 vCPUs reported".into());
    let mut cases = vec![
        Case {
            name: "demo-4".into(),
            command: "/activm run /guests/demo --vcpus 4 --stats".into(),
            status: 0,
            expect: hello,
            check: None,
            stdout: None,
        },
        Case {
            name: "archcheck-irq".into(),
            command: "/activm run /guests/archcheck --vcpus 2 --stats".into(),
            status: 0,
            expect: vec![
                "archcheck: halt woke on the timer interrupt".into(),
                "archcheck: 51 timer interrupts and ".into(),
                "SGIs at EL0, registers intact".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "archcheck-upcall".into(),
            command: "/activm run /guests/archcheck --vcpus 2 --pcpus 2 --stats -- upcall".into(),
            status: 0,
            expect: vec![
                "archcheck: upcall on vCPU 1: kind 6 arg 0".into(),
                "the USER upcall arrived on vCPU 1 through its SPI".into(),
                "USER=1".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "archcheck-preempt".into(),
            command:
                "/activm run /guests/archcheck --vcpus 2 --pcpus 2 --timeout 120 --stats -- preempt"
                    .into(),
            status: 0,
            expect: vec![
                "EL0 in the image, registers as left".into(),
                "PREEMPTED=1".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-demo-1-noact".into(),
            command: "/activm run /guests/rt-demo --vcpus 1 --no-activations --stats -- 4 2000"
                .into(),
            status: 0,
            expect: vec![
                "4 threads x 2000 increments on 1 vCPUs: total 8000 (expected 8000)".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-demo-2-noact".into(),
            command: "/activm run /guests/rt-demo --vcpus 2 --no-activations --stats -- 6 2000"
                .into(),
            status: 0,
            expect: vec![
                "6 threads x 2000 increments on 2 vCPUs: total 12000 (expected 12000)".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-tests-1-noact".into(),
            command: "/activm run /guests/rt-tests --vcpus 1 --no-activations --timeout 150".into(),
            status: 0,
            expect: rt_tests_no_activations(),
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-tests-2-noact".into(),
            command: "/activm run /guests/rt-tests --vcpus 2 --no-activations --timeout 150".into(),
            status: 0,
            expect: rt_tests_no_activations(),
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-demo-2".into(),
            command: "/activm run /guests/rt-demo --vcpus 2 --stats --timeout 60 -- 6 2000".into(),
            status: 0,
            expect: vec![
                "6 threads x 2000 increments on 2 vCPUs: total 12000 (expected 12000)".into(),
            ],
            check: None,
            stdout: None,
        },
        Case {
            name: "rt-tests-2".into(),
            command: "/activm run /guests/rt-tests --vcpus 2 --stats --timeout 150".into(),
            status: 0,
            expect: vec![
                "test random-preemption ... ok".into(),
                "test condvar-timeout ... ok".into(),
                " passed, 0 failed".into(),
            ],
            check: None,
            stdout: None,
        },
        Case::new(
            // The runtime's timeline (CNTVCT timestamps) merged into --trace.
            "rt-tests-2-trace",
            "/activm run /guests/rt-tests --vcpus 2 --stats --timeout 150 \
             --trace /trace.json -- sa-real time-slicing 2>&1 \
             && grep -q left /trace.json && echo guest thread slices in the trace",
            0,
            &[
                " passed, 0 failed",
                "trace timeline: events dropped",
                "guest thread slices in the trace",
            ],
        ),
        Case {
            name: "archcheck-fault".into(),
            command: "/activm run /guests/archcheck -- fault".into(),
            status: 125,
            expect: vec!["synchronous exception from EL0 on vCPU 0: data abort".into()],
            check: None,
            stdout: None,
        },
    ];
    cases.extend(exception_cases());
    cases.extend(blk_cases());
    cases.extend(scale_cases());
    cases.extend(app_cases::cases());
    cases.extend(hostile_cases::cases());
    cases.extend(std_cases::cases());
    cases
}

/// Exceptions at EL0 in a runtime thread, reported as on x86_64.
fn exception_cases() -> Vec<Case> {
    vec![
        Case::new(
            "rt-overflow",
            "/activm run /guests/rt-tests --vcpus 2 -- overflow",
            101,
            &["thread 'deep-recursion' overflowed its stack (guard page hit at"],
        ),
        Case::new(
            "rt-panic",
            "/activm run /guests/rt-tests --vcpus 2 -- panic",
            101,
            &["thread 'panicker' panicked", "boom on purpose"],
        ),
        Case::new(
            "rt-bad-access",
            "/activm run /guests/rt-tests --vcpus 2 -- fault bad-access",
            125,
            &[
                // The runtime's report (EC 0x24: data abort from EL0), then the VMM's.
                "activm-rt: vCPU ",
                " exception 36 at pc ",
                "fault address 0x8:",
                "synchronous exception from EL0 on vCPU ",
                ": data abort (ESR_EL1 ",
                "FAR_EL1 0x8,",
            ],
        ),
        Case::new(
            "rt-undefined",
            "/activm run /guests/rt-tests --vcpus 2 -- fault undefined",
            125,
            &[
                " exception 0 at pc ",
                ": unknown reason (undefined instruction?) (ESR_EL1 0x2000000)",
            ],
        ),
    ]
}

/// The block device: the blocking path with and without activations, the asynchronous ring,
/// and iobench, each on a fresh disk.
fn blk_cases() -> Vec<Case> {
    let blk_ok = [
        "test blk ... ok",
        "test blk-overlap ... ok",
        "2 passed, 0 failed",
        "disk bytes: 236 24",
    ];
    let mut async_ok = blk_ok.to_vec();
    async_ok.push("40 asynchronous reads");
    vec![
        Case::new(
            "blk-blocking-4",
            &with_disk(
                "blk-blocking-4",
                "/guests/rt-tests --vcpus 4 --pcpus 2 --stats --io-latency 1000",
                "--rt-blk-async=off blk blk-overlap",
            ),
            0,
            &blk_ok,
        )
        .checked(blocked_and_unblocked),
        Case::new(
            "blk-blocking-noact",
            &with_disk(
                "blk-blocking-noact",
                "/guests/rt-tests --vcpus 2 --no-activations --stats --io-latency 500",
                "--rt-blk-async=off blk blk-overlap",
            ),
            0,
            &blk_ok,
        ),
        Case::new(
            "blk-async-4",
            &with_disk(
                "blk-async-4",
                "/guests/rt-tests --vcpus 4 --pcpus 2 --stats --io-latency 1000",
                "blk blk-overlap",
            ),
            0,
            &async_ok,
        )
        .checked(never_blocked),
        Case::new(
            "iobench-serve",
            &with_disk(
                "iobench-serve",
                "/guests/iobench --vcpus 2 --stats --io-latency 200",
                "serve 4 40 10",
            ),
            0,
            // 40 reads of zeros hashed 10 times: the same sum as on x86_64.
            &[
                "RESULT serve ms=",
                " requests=40 check=1015200 table_slots=0",
            ],
        ),
        Case::new(
            "iobench-storm",
            &with_disk(
                "iobench-storm",
                "/guests/iobench --vcpus 2 --stats",
                "--rt-blk-async=off storm 4 10",
            ),
            0,
            &["RESULT storm ms=", " flushes=40 check=4"],
        )
        .checked(blocked_and_unblocked_any),
    ]
}

/// The flush storm blocks its vCPUs: every BLOCKED came back.
fn blocked_and_unblocked_any(output: &str) -> Result<(), String> {
    let blocked = upcalls(output, "BLOCKED").unwrap_or(0);
    let unblocked = upcalls(output, "UNBLOCKED").unwrap_or(0);
    if blocked == 0 || blocked != unblocked {
        return Err(format!(
            "{blocked} BLOCKED and {unblocked} UNBLOCKED upcalls"
        ));
    }
    Ok(())
}

/// 4 vCPUs on the QEMU machine's 2 processors, and a short chaos soak.
fn scale_cases() -> Vec<Case> {
    vec![
        Case::new(
            "rt-demo-4",
            "/activm run /guests/rt-demo --vcpus 4 --stats --timeout 60 -- 8 2000",
            0,
            &["8 threads x 2000 increments on 4 vCPUs: total 16000 (expected 16000)"],
        ),
        Case::new(
            "rt-tests-4",
            "/activm run /guests/rt-tests --vcpus 4 --stats --timeout 150",
            0,
            &[
                "test random-preemption ... ok",
                "test sa-chaos ... ok",
                " passed, 0 failed",
            ],
        ),
        Case::new(
            "chaos-soak-4",
            &with_disk(
                "chaos-soak-4",
                "/guests/rt-tests --vcpus 4 --pcpus 2 --chaos 5 --stats --timeout 120 --io-latency 200",
                "--rt-blk-async=off chaos-soak 5",
            ),
            0,
            &["chaos-soak: ok (5 s:"],
        )
        .checked(soak_counts),
    ]
}

/// What `rt-tests --no-activations` must print (as on x86_64).
fn rt_tests_no_activations() -> Vec<String> {
    [
        "test upcall-preempted ... ok",
        "test upcall-continuation ... ok",
        "test upcall-blocked ... ok",
        "test condvar-timeout ... ok",
        "test std-rendezvous ... ok",
        "test std-cases-preempted ... ok",
        "test stack-cache-shared ... ok",
        "test random ... ok",
        // fp-control-decoder (x86_64 instructions) is skipped.
        "37 passed, 0 failed",
    ]
    .map(String::from)
    .to_vec()
}
