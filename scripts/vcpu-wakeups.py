#!/usr/bin/env python3
"""How long an activm process's vCPU threads wait between being woken and running, split by
what was running on the host CPU Linux put them on (docs/activations.md, "Placing granted vCPUs
on host CPUs").

    perf sched record -o sched.data -- activm run --config lat.toml
    perf script -i sched.data -F comm,pid,tid,cpu,time,event,trace > sched.txt
    scripts/vcpu-wakeups.py sched.txt PID     # PID: the activm process (its vCPU threads' tgid)
"""
import collections
import re
import sys

LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+): (.*)")


def main(path, ours):
    events, tgid = [], {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                comm, pid, tid = m.group(1), int(m.group(2)), int(m.group(3))
                tgid[tid] = pid
                events.append((comm, pid, tid, int(m.group(4)), float(m.group(5)), m.group(6), m.group(7)))
    vcpus = {tid for comm, pid, tid, *_ in events if pid == ours and re.match(r"g\d+-vcpu", comm)}

    def kind(running):
        if running == 0:
            return "idle"
        if running in vcpus:
            return "our vCPU thread"
        return "our other thread" if tgid.get(running) == ours else "other process"

    current, pending, waits = {}, {}, collections.defaultdict(list)
    for comm, pid, tid, cpu, t, event, rest in events:
        if event == "sched_switch":
            nxt = int(re.search(r"next_pid=(\d+)", rest).group(1))
            current[cpu] = nxt
            if nxt in pending:
                woken, there = pending.pop(nxt)
                waits[there].append((t - woken) * 1e6)
        elif event == "sched_migrate_task":
            m = re.search(r"pid=(\d+) .*dest_cpu=(\d+)", rest)
            p = int(m.group(1))
            if p in pending:
                pending[p] = (pending[p][0], kind(current.get(int(m.group(2)), 0)))
        elif event == "sched_waking":
            m = re.search(r"pid=(\d+) prio=\d+ target_cpu=(\d+)", rest)
            p = int(m.group(1))
            if p in vcpus:
                pending[p] = (t, kind(current.get(int(m.group(2)), 0)))

    def at(v, q):
        return sorted(v)[round((len(v) - 1) * q)]

    print("vCPU thread wake-ups, by what ran on the CPU it was put on (wait until it ran)")
    for there, v in sorted(waits.items()):
        over = sum(1 for x in v if x > 1000)
        print(f"  {there:<17} n={len(v):6}  median {at(v, .5):8.1f} us  p99 {at(v, .99):9.1f} us  over 1 ms: {over}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]))
