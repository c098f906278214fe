#!/bin/sh
# An activation guest beside an I/O-heavy neighbour, in one activm process, many times over
# (docs/activations.md, "A neighbour that blocks in the VMM"). Guests use the blocking disk path
# (--rt-blk-async=off): the neighbour's vCPUs block in the VMM.
#
#   scripts/neighbour-soak.sh [RUNS] [storm|serve|six] [EXTRA ACTIVM OPTIONS...]
#
# Each run: rt-demo (activations, 2 vCPUs, 8 threads x DEMO_ITERS increments) beside either
#   storm: iobench storm (4 vCPUs, 8 threads writing and flushing their own 4 KiB, STORM_ROUNDS
#          rounds; every flush blocks in the VMM), or
#   serve: iobench serve (4 vCPUs, 16 threads reading a disk slowed down with --io-latency 200),
# on --pcpus 2 with --timeout 60 and --stats; a run still going after HANG_SECS (default 45) gets
# SIGQUIT (an activation guest that still handles upcalls prints its runtime state), and 3 s later
# SIGTERM (activm prints the registers of each vCPU it finds in KVM_RUN and stops); or
#   six:   six activm processes at once, each one 4-vCPU rt-tests chaos-soak SOAK_SECS (default
#          10) on --pcpus 2 with --chaos (seed = run number) and a disk slowed down with
#          --io-latency 200 (the options of tests/kvm.rs chaos_soak_keeps_every_invariant);
#          every process counts as a run.
# LATENCY_CRITICAL=demo or =io marks that guest latency_critical in storm and serve modes: the
# other one's vCPU threads then run at the host's idle priority (batch_sched_idle).
# A run passes when activm exits 0 and both guests print their
# exact results. Prints one line per run and the count; logs of failed runs are kept in
# $OUT (default: a new directory under /tmp). Needs release builds:
#   cargo build --release -p activm-vmm && cargo xtask build-guests --release
set -u
RUNS=${1:-24}
MODE=${2:-storm}
[ $# -ge 2 ] && shift 2 || shift $#
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ACTIVM=${ACTIVM:-$ROOT/target/release/activm}
G=${GUESTS:-$ROOT/guests/target/x86_64-activm/release}
DEMO_ITERS=${DEMO_ITERS:-20000000}
STORM_ROUNDS=${STORM_ROUNDS:-1000}
OUT=${OUT:-$(mktemp -d /tmp/neighbour-soak.XXXXXX)}
mkdir -p "$OUT"
truncate -s 64M "$OUT/disk.img"
if [ "$MODE" = six ]; then
    SOAK_SECS=${SOAK_SECS:-10}
    failed=0
    i=1
    while [ "$i" -le "$RUNS" ]; do
        for g in 0 1 2 3 4 5; do
            truncate -s 4M "$OUT/disk-$g.img"
            (
                "$ACTIVM" run "$G/rt-tests" --vcpus 4 --pcpus 2 --chaos "$i" --stats \
                    --timeout $((SOAK_SECS + 60)) --disk "$OUT/disk-$g.img" --io-latency 200 \
                    "$@" -- --rt-blk-async=off chaos-soak "$SOAK_SECS" >"$OUT/run-$i-$g.log" 2>&1
                echo "status $?" >>"$OUT/run-$i-$g.log"
            ) &
        done
        wait
        for g in 0 1 2 3 4 5; do
            log="$OUT/run-$i-$g.log"
            if grep -q "^chaos-soak: ok" "$log" && grep -q "^status 0$" "$log"; then
                rm -f "$log"
            else
                failed=$((failed + 1))
                why=$(grep -m1 -E "activm: |panicked|FAILED" "$log" | cut -c1-150)
                echo "run $i guest $g: FAILED $why; log $log"
            fi
        done
        echo "round $i done"
        i=$((i + 1))
    done
    echo "neighbour-soak six: $failed of $((6 * RUNS)) runs failed (logs in $OUT)"
    [ "$failed" -eq 0 ]
    exit
fi
case $MODE in
storm)
    NEIGHBOUR_ARGS="\"--rt-blk-async=off\", \"storm\", \"8\", \"$STORM_ROUNDS\""
    NEIGHBOUR_OK="RESULT storm .* flushes=$((8 * STORM_ROUNDS)) check=8"
    LATENCY="" ;;
serve)
    NEIGHBOUR_ARGS='"--rt-blk-async=off", "serve", "16", "4000", "100", "20"'
    NEIGHBOUR_OK="RESULT serve .* requests=4000 check=35988000 table_slots=1"
    LATENCY="io_latency = 200" ;;
*)
    echo "usage: $0 [RUNS] [storm|serve|six] [ACTIVM OPTIONS...]" >&2
    exit 2 ;;
esac
cat > "$OUT/neighbours.toml" <<TOML
pcpus = 2
timeout = 60
$LATENCY

[[guest]]
image = "$G/rt-demo"
name = "demo"
vcpus = 2
args = ["8", "$DEMO_ITERS"]
latency_critical = $([ "${LATENCY_CRITICAL:-}" = demo ] && echo true || echo false)

[[guest]]
image = "$G/iobench"
name = "io"
vcpus = 4
disk = "disk.img"
args = [$NEIGHBOUR_ARGS]
latency_critical = $([ "${LATENCY_CRITICAL:-}" = io ] && echo true || echo false)
TOML
DEMO_OK="\[demo\] rt-demo: 8 threads x $DEMO_ITERS increments on 2 vCPUs: total $((8 * DEMO_ITERS)) (expected $((8 * DEMO_ITERS)))"
failed=0
i=1
while [ "$i" -le "$RUNS" ]; do
    log="$OUT/run-$i.log"
    "$ACTIVM" run --config "$OUT/neighbours.toml" --stats "$@" >"$log" 2>&1 &
    pid=$!
    (
        sleep "${HANG_SECS:-45}"
        kill -QUIT "$pid" 2>/dev/null || exit
        sleep 3
        kill -TERM "$pid" 2>/dev/null
    ) &
    watchdog=$!
    wait "$pid"
    status=$?
    kill "$watchdog" 2>/dev/null
    if [ $status -eq 0 ] && grep -q "$DEMO_OK" "$log" && grep -q "$NEIGHBOUR_OK" "$log"; then
        echo "run $i: ok"
        rm -f "$log"
    else
        failed=$((failed + 1))
        why=$(grep -m1 -E "activm: |panicked|FAILED|timeout" "$log" | cut -c1-150)
        echo "run $i: FAILED (status $status) $why; log $log"
    fi
    i=$((i + 1))
done
echo "neighbour-soak $MODE: $failed of $RUNS runs failed (logs in $OUT)"
[ "$failed" -eq 0 ]
