//! `selftest` (the stub-level checks that do not depend on x86 instructions, and the
//! scheduler-activation cases driven by hand), `threadbench` and `nbody` on arm64 KVM, with the
//! x86_64 suite's expectations (tests/kvm.rs); the numbers the benchmarks print are not checked
//! (TCG timings mean nothing), their results are.

use super::case::{upcalls, Case};

/// Every upcall the activation test expects arrived once.
fn sa_counts(output: &str) -> Result<(), String> {
    let got = ["NEWPROC", "PREEMPTED", "USER"].map(|kind| upcalls(output, kind));
    if got != [Some(1); 3] {
        return Err(format!(
            "NEWPROC, PREEMPTED, USER upcalls: {got:?}, expected 1 each"
        ));
    }
    Ok(())
}

fn selftest_cases() -> Vec<Case> {
    vec![
        Case::new("selftest-exit", "/activm run /guests/selftest -- exit 300", 300 & 0xff, &[]),
        Case::new(
            "selftest-panic",
            "/activm run /guests/selftest -- panic",
            101,
            &["guest panicked on vCPU 0", "selftest panic on purpose"],
        ),
        Case::new(
            "selftest-args",
            "/activm run /guests/selftest -- args one \"two words\"",
            0,
            &["argc=3", "arg[1]=one", "arg[2]=two words"],
        ),
        Case::new(
            "selftest-heap",
            "/activm run /guests/selftest --mem 64M -- heap",
            0,
            &["heap ok"],
        ),
        Case::new(
            "selftest-fp",
            "/activm run /guests/selftest -- fp",
            0,
            &["fp sum=1.644933"],
        ),
        Case::new(
            "selftest-unknown-hypercall",
            "/activm run /guests/selftest -- unknown-hypercall",
            125,
            &["unknown hypercall 511"],
        ),
        Case::new(
            "selftest-bad-pointer",
            "/activm run /guests/selftest -- bad-pointer",
            125,
            &["malformed hypercall console_write", "outside guest RAM"],
        ),
        // One vCPU loses its processor: its context reaches the other vCPU in a PREEMPTED
        // record, comes back as a new activation (NEWPROC) that resumes it (registers, SIMD
        // state, TPIDR_EL0), then gets a USER upcall. The guest checks every record.
        Case::new(
            "selftest-sa",
            "/activm run /guests/selftest --vcpus 2 --pcpus 2 --stats --timeout 120 -- sa",
            0,
            &["sa ok", "resumed on activation", "preemption latency"],
        )
        .checked(sa_counts),
        Case::new(
            "selftest-sa-noact",
            "/activm run /guests/selftest --vcpus 2 --no-activations -- sa",
            3,
            &["activations unsupported"],
        ),
        // Not `sa-defer`: the VMM gives a deferred preemption 100 us of grace (DEFER_GRACE_US)
        // before it preempts anyway, and under TCG on a loaded host the guest's loop between two
        // looks at `preempt_pending` can outlast it (1 of 3 runs at a load average of 13: a
        // PREEMPTED record, then the guest's 10 s timeout). x86_64 runs it.
        // A guest that corrupts its shared area is stopped; its neighbour finishes.
        Case::new(
            "selftest-sa-hostile",
            "/activm run --vcpus 2 --pcpus 4 --timeout 120 /guests/selftest /guests/demo -- sa-hostile",
            125,
            &[
                "[demo] all 2 vCPUs reported",
                "[selftest] guest fault",
                "does not consume its upcalls",
                "[demo] exit status 0",
            ],
        ),
        Case::new(
            "selftest-smp-chaos",
            "/activm run /guests/selftest --vcpus 4 --pcpus 2 --chaos 7 --stats --timeout 150 -- smp",
            0,
            &["smp total=4000000 expected=4000000"],
        ),
    ]
}

fn bench_cases() -> Vec<Case> {
    vec![
        // Same checks as on x86_64 (the N-body sum is bit-identical: no FP contraction).
        Case::new(
            "nbody-4",
            "/activm run /guests/nbody --vcpus 2 --timeout 120 -- nbody 64 5 4",
            0,
            &[
                "RESULT nbody bodies=64 steps=5 threads=4 ms=",
                " check=98.087551568",
            ],
        ),
        Case::new(
            "nbody-locks",
            "/activm run /guests/nbody --vcpus 2 --timeout 120 -- locks 4 20000 4",
            0,
            &[
                "RESULT locks threads=4 entries=20000 locks=4 ms=",
                " check=20000",
            ],
        ),
        Case::new(
            "nbody-spawn",
            "/activm run /guests/nbody --vcpus 2 --timeout 120 -- spawn 500 2",
            0,
            &["RESULT spawn threads=500 ms=", " check=500"],
        ),
        Case::new(
            "threadbench",
            "(for op in null-fork signal-wait yield mutex mutex-contended; do \
             /activm run /guests/threadbench --vcpus 2 --timeout 60 -- $op iters=200 trials=2 \
             || exit $?; done; \
             /activm run /guests/threadbench --vcpus 2 --timeout 60 -- \
             create total=200 top=4 children=5 trials=2 && \
             /activm run /guests/threadbench --vcpus 2 --timeout 60 -- \
             contention total=2000 threads=4 regions=2 trials=2)",
            0,
            &[
                "BENCH null-fork ",
                "BENCH signal-wait ",
                "BENCH yield ",
                "BENCH mutex ",
                "BENCH mutex-contended ",
                "BENCH create ",
                "BENCH contention ",
            ],
        ),
    ]
}

pub(super) fn cases() -> Vec<Case> {
    let mut cases = selftest_cases();
    cases.extend(bench_cases());
    cases
}
