//! The `std` guests (guests/apps/std-*, built for `guests/aarch64-activm-std.json`) on arm64
//! KVM: the same programs and the same exact outputs as on x86_64 (tests/kvm/std_guests.rs).

use super::case::{stdout_of, upcalls, Case};

/// The std guests the cases run (copied into the initramfs).
pub(super) const STD_APPS: &[&str] = &[
    "std-demo",
    "std-rayon",
    "std-crossbeam-tests",
    "std-fs",
    "std-udp",
    "std-kv",
    "std-async",
];

/// `std-udp self`'s whole stdout (tests/kvm/net_udp.rs checks the same lines on x86_64).
const NET_SELF_OUTPUT: &str = "std-udp self: server got ping
std-udp self: client got pong
std-udp self: recv with a 50 ms timeout: Err(WouldBlock), after 50 ms or more: true
std-udp self: tcp 65536 bytes each way, wrong bytes: 0 and 0
std-udp self: waited for late; computed during the wait: true
std-udp self: udp6 ping6 and pong6; server bound [::]:53, sender is IPv6: true, answer from [::1]:47201
std-udp self: tcp6 hello6 -> HELLO6 from [::1]:47202; listener [::]:80, peer is IPv6: true
std-udp self: tcp6 to [2001:db8::1]:80: Err(PermissionDenied)
std-udp self: done
";

/// `std-demo --exit 3`'s whole stdout on `vcpus` vCPUs (the same file checks both arches).
fn std_demo_output(vcpus: u32) -> String {
    include_str!("../../../guests/apps/std-demo/expected-stdout.txt")
        .replace("{vcpus}", &vcpus.to_string())
}

/// `std-rayon`'s whole stdout on `vcpus` vCPUs (the same file checks both arches).
fn rayon_output(vcpus: u32) -> String {
    include_str!("../../../guests/apps/std-rayon/expected-stdout.txt")
        .replace("{vcpus}", &vcpus.to_string())
}

/// crossbeam-channel's own test suite: its libtest arguments (4 test threads, the tests the
/// guest cannot run, from the file tests/kvm/std_guests.rs reads too) and expected summary.
fn crossbeam_run(flags: &str) -> (String, String) {
    let skips = include_str!("../../../guests/apps/std-crossbeam-tests/skipped.txt")
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_whitespace().next())
        .map(|name| format!(" --skip {name}"))
        .collect::<String>();
    let result = include_str!("../../../guests/apps/std-crossbeam-tests/expected-result.txt");
    (
        format!(
            "/activm run /guests/std-crossbeam-tests {flags} --timeout 300 -- --test-threads 4{skips}"
        ),
        result.trim_end().to_string(),
    )
}

/// The guest's wall clock (`now: SECS`) is within 120 s of the arm64 machine's (`machine-now:
/// SECS`, printed by `date` just before).
fn clock_agrees(output: &str) -> Result<(), String> {
    let secs = |prefix: &str| -> Result<u64, String> {
        output
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("no `{prefix}SECS` line"))
    };
    let (machine, guest) = (secs("machine-now: ")?, secs("now: ")?);
    if machine.abs_diff(guest) <= 120 {
        Ok(())
    } else {
        Err(format!(
            "guest wall clock {guest} s, machine {machine} s: more than 120 s apart"
        ))
    }
}

/// At least the 5 fsyncs blocked the vCPU, each told by a BLOCKED and an UNBLOCKED record.
fn slow_calls_blocked(output: &str) -> Result<(), String> {
    let blocked = output
        .lines()
        .find_map(|l| l.split("slow file calls (vCPU blocked)=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
        .ok_or("no slow file-call count in --stats")?;
    let (b, u) = (upcalls(output, "BLOCKED"), upcalls(output, "UNBLOCKED"));
    if blocked >= 5 && b == Some(blocked) && u == b {
        Ok(())
    } else {
        Err(format!(
            "{blocked} slow file calls, BLOCKED {b:?}, UNBLOCKED {u:?}"
        ))
    }
}

pub(super) fn cases() -> Vec<Case> {
    let runs = [
        ("std-demo-2", "std-rayon-2", 2, "--vcpus 2"),
        ("std-demo-4", "std-rayon-4", 4, "--vcpus 4"),
        (
            "std-demo-2-noact",
            "std-rayon-2-noact",
            2,
            "--vcpus 2 --no-activations",
        ),
    ];
    let mut cases = Vec::new();
    for (demo, rayon, vcpus, flags) in runs {
        cases.push(Case::exact(
            demo,
            stdout_of(
                demo,
                &format!("/guests/std-demo {flags} --timeout 150"),
                "--exit 3",
            ),
            3,
            std_demo_output(vcpus),
        ));
        cases.push(Case::exact(
            rayon,
            stdout_of(
                rayon,
                &format!("/guests/std-rayon {flags} --timeout 150"),
                "",
            ),
            0,
            rayon_output(vcpus),
        ));
    }
    // A panic in a std thread: std's message, then sys_abort's status 134.
    cases.push(Case::new(
        "std-panic",
        "/activm run /guests/std-demo --vcpus 2 --timeout 60 -- panic",
        134,
        &["thread 'doomed' (2) panicked at src/main.rs:", "boom"],
    ));
    // The wall clock and the environment (`--env`), and nothing of the host's environment.
    cases.push(
        Case::new(
            "std-env-clock",
            "echo machine-now: $(date +%s); HOST_ONLY=leaked /activm run /guests/std-demo \
             --vcpus 2 --timeout 60 --env \"GREETING=hello = world\" -- env-clock GREETING HOST_ONLY",
            0,
            &[
                "GREETING: Some(\"hello = world\")",
                "HOST_ONLY: None",
                "vars: 1",
            ],
        )
        .checked(clock_agrees),
    );
    // Slow file calls block the vCPU (tests/kvm/std_files.rs): on the initramfs's tmpfs every
    // read hits the page cache, so the 5 fsyncs are what blocks, each a BLOCKED / UNBLOCKED.
    cases.push(
        Case::new(
            "std-fs-slow",
            "mkdir -p /tmp/fsmnt && dd if=/dev/zero of=/tmp/fsmnt/cold.bin bs=4096 count=16 \
             2>/dev/null && /activm run /guests/std-fs --vcpus 2 --pcpus 1 --stats --timeout 120 \
             --mount /tmp/fsmnt:/data -- slow 5",
            0,
            &["cold: 65536 bytes", "fsync: 5 of 5"],
        )
        .checked(slow_calls_blocked),
    );
    // Sockets: the guest talks to itself through the machine's loopback (UDP both ways, a read
    // timeout, 64 KiB each way over TCP, a wait beside a thread that never yields), on 2 vCPUs
    // and on 1 (where the wait must hold no processor).
    for (name, vcpus) in [("std-net-self-2", 2), ("std-net-self-1", 1)] {
        cases.push(Case::exact(
            name,
            format!(
                "(ip link set lo up || ifconfig lo 127.0.0.1 up) 2>/dev/null; {}",
                stdout_of(
                    name,
                    &format!(
                        "/guests/std-udp --vcpus {vcpus} --timeout 120 --publish 47201:53/udp \
                         --publish 47202:80 --allow-connect 127.0.0.1:47201/udp \
                         --allow-connect 127.0.0.1:47202"
                    ),
                    "self 47201 47202",
                )
            ),
            0,
            NET_SELF_OUTPUT.to_string(),
        ));
    }
    // The mio echo server and 8 client connections to itself through the loopback, and
    // eventfd's wake-ups across threads (tests/kvm/std_async.rs checks the same on x86_64).
    cases.push(Case::exact(
        "std-async-self",
        format!(
            "(ip link set lo up || ifconfig lo 127.0.0.1 up) 2>/dev/null; {}",
            stdout_of(
                "std-async-self",
                "/guests/std-async --vcpus 2 --timeout 120 --publish 47204:80 \
                 --allow-connect 127.0.0.1:47204",
                "self 47204 8",
            )
        ),
        0,
        "std-async self: 8 connections echoed 65536 bytes each, wrong bytes: 0
std-async self: server accepted 8, timer ticked while serving: true, stopped by the waker: true
std-async self: done
"
        .to_string(),
    ));
    cases.push(Case::new(
        "std-async-eventfd",
        "/activm run /guests/std-async --vcpus 2 --timeout 120 -- eventfd",
        0,
        &[
            "std-async eventfd: semaphore reads [\"Ok(1)\", \"Ok(1)\", \"Err(11 WouldBlock)\"]",
            "std-async eventfd: blocking read got 7 after 100 ms or more: true",
            "std-async eventfd: blocking write waited: true, read 0xfffffffffffffffe then 5",
            "std-async eventfd: ping-pong 10000 round trips, wrong values: 0",
            "std-async eventfd: done",
        ],
    ));
    // std-kv's RESP server driven by separate client processes (busybox `nc`) through the
    // published port: SET/GET/INCR answers checked, then 4 connections at once send 50 INCRs
    // each and the count must be 200; activm is ended by SIGTERM.
    for (name, flags) in [
        ("std-kv-client", ""),
        ("std-kv-client-noact", " --no-activations"),
    ] {
        cases.push(Case::new(
            name,
            &format!(
                "(ip link set lo up || ifconfig lo 127.0.0.1 up) 2>/dev/null; \
                 /activm run /guests/std-kv --vcpus 2{flags} --timeout 120 --publish 47203:6379 \
                 -- 6379 & p=$!; i=0; until printf 'PING\\r\\nQUIT\\r\\n' | nc 127.0.0.1 47203 2>/dev/null \
                 | grep -q PONG; do i=$((i+1)); [ $i -gt 60 ] && break; sleep 1; done; \
                 printf 'SET k hello\\r\\nGET k\\r\\nINCR n\\r\\nINCR n\\r\\nQUIT\\r\\n' \
                 | nc 127.0.0.1 47203 | tr -d '\\r' | tr '\\n' ' ' | sed 's/^/kv: /'; echo; \
                 c=''; for j in 1 2 3 4; do (k=0; while [ $k -lt 50 ]; do printf 'INCR c\\r\\n'; \
                 k=$((k+1)); done; printf 'QUIT\\r\\n') | nc 127.0.0.1 47203 >/dev/null & c=\"$c $!\"; \
                 done; wait $c; printf 'GET c\\r\\nQUIT\\r\\n' | nc 127.0.0.1 47203 | tr -d '\\r' \
                 | tr '\\n' ' ' | sed 's/^/kv-count: /'; echo; \
                 kill $p; wait $p; echo kv-status=$?"
            ),
            0,
            &[
                "kv: +OK $5 hello :1 :2 +OK",
                "kv-count: $3 200 +OK",
                "kv-status=143",
            ],
        ));
    }
    // crossbeam-channel's test suite on 2 vCPUs: libtest's summary, 0 failed.
    let (command, result) = crossbeam_run("--vcpus 2");
    cases.push(Case::new(
        "std-crossbeam-2",
        &command,
        0,
        &[result.as_str()],
    ));
    cases
}
