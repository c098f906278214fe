#!/bin/sh
# The runtime's own test suite on host-scheduled vCPUs (plain KVM: every vCPU thread left to
# Linux, oblivious guest), many times over and several at once, as CI's
# rt_tests_host_sched_4_vcpus runs it once (docs/activations.md, "Not done yet": the host-sched
# hang and the interrupt watch).
#
#   scripts/host-sched-soak.sh [RUNS] [AT_ONCE] [EXTRA ACTIVM OPTIONS...]
#
# (the extra options may not repeat the ones below: activm refuses a flag given twice)
#
# Each run: rt-tests on 4 vCPUs with --host-sched --stats --timeout 60; AT_ONCE runs (default 3)
# go at a time, so the host is loaded as a shared machine is. A run passes when activm exits 0
# and the suite prints "N passed, 0 failed". A hung run ends at the timeout with status 124 and
# the hang report (every vCPU's place, registers, interrupt state and its thread's host CPU
# time in the last 50 ms; the runtime's threads) in its log, which is kept in $OUT (default: a
# new directory under /tmp). Prints one line per failed run, then the count and how many runs
# needed the interrupt watch. Needs release builds:
#   cargo build --release -p activm-vmm && cargo xtask build-guests --release
set -u
RUNS=${1:-100}
AT_ONCE=${2:-3}
[ $# -ge 2 ] && shift 2 || shift $#
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ACTIVM=${ACTIVM:-$ROOT/target/release/activm}
G=${GUESTS:-$ROOT/guests/target/x86_64-activm/release}
OUT=${OUT:-$(mktemp -d /tmp/host-sched-soak.XXXXXX)}
mkdir -p "$OUT"
failed=0
watched=0
i=1
while [ "$i" -le "$RUNS" ]; do
    batch=""
    j=0
    while [ "$j" -lt "$AT_ONCE" ] && [ "$i" -le "$RUNS" ]; do
        (
            "$ACTIVM" run "$G/rt-tests" --vcpus 4 --host-sched --stats --timeout 60 "$@" \
                >"$OUT/run-$i.log" 2>&1
            echo "status $?" >>"$OUT/run-$i.log"
        ) &
        batch="$batch $i"
        i=$((i + 1))
        j=$((j + 1))
    done
    wait
    for r in $batch; do
        log="$OUT/run-$r.log"
        if grep -q "interrupt watch: undelivered interrupts redelivered=[1-9]" "$log"; then
            watched=$((watched + 1))
        fi
        if grep -q "^status 0$" "$log" && grep -qE "[0-9]+ passed, 0 failed" "$log"; then
            rm -f "$log"
        else
            failed=$((failed + 1))
            status=$(sed -n 's/^status //p' "$log")
            why=$(grep -m1 -E "activm: |error|FAILED|failed" "$log" | cut -c1-150)
            echo "run $r: FAILED (status $status) $why; log $log"
        fi
    done
done
echo "host-sched-soak: $failed of $RUNS runs failed, $watched needed the interrupt watch (logs in $OUT)"
[ "$failed" -eq 0 ]
