//! UDP for std guests (`devices/net/udp.rs`): guests/apps/std-udp against a host echo socket
//! of the test's own, both ways (the guest sends to an `--allow-connect .../udp` address; the
//! test's second socket sends to a `--publish .../udp` port and gets the answer), with
//! truncation, `peek_from`, a non-blocking `recv`, a refused `send_to`, and a `recv_from` that
//! waits on 1 vCPU while another guest thread computes; and the guest talking to itself over
//! UDP and TCP, IPv4 and IPv6 (`[::]` / `[::1]`, a view of IPv4 loopback). Without the flags
//! every bind is `EACCES`; bad flag values are usage errors (status 2).

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use super::{activm_run, std_guests::std_guest, Run, ACTIVM};

/// A UDP port nobody uses now.
fn free_udp_port() -> Result<u16, Failed> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The test's echo socket: answers the guest's client as `std-udp` expects; on "serve" sends
/// "echo-me" from a second socket to the published port after 300 ms and checks the answer.
fn echo(sock: UdpSocket, published: SocketAddr) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(e)?;
    let mut buf = [0u8; 256];
    loop {
        let (n, from) = sock.recv_from(&mut buf).map_err(e)?;
        match &buf[..n] {
            b"ping" => sock.send_to(b"pong:ping", from).map(drop).map_err(e)?,
            b"hello" => {
                sock.send_to(b"pong:hello", from).map_err(e)?;
                sock.send_to(b"second", from).map(drop).map_err(e)?;
            }
            b"peek" => sock.send_to(b"pong:peek", from).map(drop).map_err(e)?,
            b"late" => {
                std::thread::sleep(Duration::from_millis(200));
                sock.send_to(b"pong:late", from).map(drop).map_err(e)?;
            }
            b"serve" => {
                std::thread::sleep(Duration::from_millis(300));
                let other = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
                other
                    .set_read_timeout(Some(Duration::from_secs(60)))
                    .map_err(e)?;
                other.send_to(b"echo-me", published).map_err(e)?;
                let (n, from) = other.recv_from(&mut buf).map_err(e)?;
                if &buf[..n] != b"echo-me" || from != published {
                    return Err(format!("the server answered {:?} from {from}", &buf[..n]));
                }
                return Ok(());
            }
            other => return Err(format!("unexpected datagram {other:?}")),
        }
    }
}

fn echo_both_ways() -> Result<(), Failed> {
    echo_run(false).map(drop)
}

/// The same beside a thread that computes without any scheduling point on the guest's one
/// vCPU: the VMM interrupts that vCPU for the server's socket report (else it waited for the
/// thread's time slice to end).
fn wait_beside_a_thread_that_never_yields() -> Result<(), Failed> {
    let run = echo_run(true)?;
    let key = "socket reports nudged to a busy vCPU=";
    let nudged: u64 = run
        .stderr
        .split(key)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no {key:?} in --stats\n{}", run.stderr))?;
    if nudged == 0 {
        return Err(format!("no socket report nudged\n{}", run.stderr).into());
    }
    Ok(())
}

/// `std-udp` against the echo socket on 1 vCPU (`spin`: its computing thread never yields),
/// every step's line checked.
fn echo_run(spin: bool) -> Result<Run, Failed> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let echo_addr = sock.local_addr()?;
    let host_port = free_udp_port()?;
    let published: SocketAddr = format!("127.0.0.1:{host_port}").parse()?;
    let other = format!("127.0.0.1:{}", free_udp_port()?);
    let echo_thread = std::thread::spawn(move || echo(sock, published));
    let run = activm_run(
        &std_guest("std-udp")?,
        &[
            "--vcpus",
            "1",
            "--publish",
            &format!("{host_port}:53/udp"),
            "--allow-connect",
            &format!("{echo_addr}/udp"),
            "--stats",
        ],
        &[
            "53",
            &echo_addr.to_string(),
            &other,
            if spin { "spin" } else { "" },
        ][..if spin { 4 } else { 3 }],
    )?
    .expect_code(0)?;
    for line in [
        "std-udp: server on 0.0.0.0:53",
        "std-udp: client port is set: true",
        "std-udp: pong:ping from the echo: true",
        "std-udp: connected to the echo: true",
        "std-udp: truncated to 4: pong",
        "std-udp: next datagram: second",
        "std-udp: peeked pong:peek from the echo: true, then took pong:peek",
        "std-udp: recv with a 50 ms timeout: Err(WouldBlock), after 50 ms or more: true",
        "std-udp: after the timeout: pong:late",
        "std-udp: non-blocking recv: Err(WouldBlock)",
        "std-udp: send_to elsewhere: Err(\"Permission denied (os error 13)\")",
        "std-udp: server got echo-me; computed during the wait: true",
        "std-udp: done",
    ] {
        if !run.stdout.lines().any(|l| l == line) {
            return Err(format!("stdout lacks {line:?}\n--- stdout\n{}", run.stdout).into());
        }
    }
    echo_thread
        .join()
        .map_err(|_| "the echo thread panicked")??;
    Ok(run)
}

fn usage_error(flag: &str, value: &str, says: &str) -> Result<(), Failed> {
    let out = Command::new(ACTIVM)
        .arg("run")
        .arg(std_guest("std-udp")?)
        .args([flag, value])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains(says) {
        return Err(format!("{flag} {value}: {:?}: {err}", out.status.code()).into());
    }
    Ok(())
}

/// `std-udp self`: the guest reaches its own published UDP and TCP ports through the host's
/// loopback (the aarch64 suite runs the same inside its arm64 machine), `vcpus` vCPUs.
fn to_itself(vcpus: &str, extra: &[&str]) -> Result<(), Failed> {
    let (udp, tcp) = (free_udp_port()?, free_tcp_port()?);
    let (udp, tcp) = (udp.to_string(), tcp.to_string());
    let mut options = vec![
        "--vcpus".to_string(),
        vcpus.to_string(),
        "--publish".to_string(),
        format!("{udp}:53/udp"),
        "--publish".to_string(),
        format!("{tcp}:80"),
        "--allow-connect".to_string(),
        format!("127.0.0.1:{udp}/udp"),
        "--allow-connect".to_string(),
        format!("127.0.0.1:{tcp}"),
    ];
    options.extend(extra.iter().map(|s| s.to_string()));
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let run =
        activm_run(&std_guest("std-udp")?, &options, &["self", &udp, &tcp])?.expect_code(0)?;
    let expected = format!(
        "std-udp self: server got ping
std-udp self: client got pong
std-udp self: recv with a 50 ms timeout: Err(WouldBlock), after 50 ms or more: true
std-udp self: tcp 65536 bytes each way, wrong bytes: 0 and 0
std-udp self: waited for late; computed during the wait: true
std-udp self: udp6 ping6 and pong6; server bound [::]:53, sender is IPv6: true, answer from [::1]:{udp}
std-udp self: tcp6 hello6 -> HELLO6 from [::1]:{tcp}; listener [::]:80, peer is IPv6: true
std-udp self: tcp6 to [2001:db8::1]:80: Err(PermissionDenied)
std-udp self: done
"
    );
    if run.stdout != expected {
        return Err(format!(
            "stdout differs\n--- got\n{}--- wanted\n{expected}",
            run.stdout
        )
        .into());
    }
    Ok(())
}

fn free_tcp_port() -> Result<u16, Failed> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn tests() -> Vec<Trial> {
    vec![
        Trial::test("net_udp_echo_both_ways_truncation_and_wait", echo_both_ways),
        Trial::test(
            "net_udp_wait_beside_a_thread_that_never_yields",
            wait_beside_a_thread_that_never_yields,
        ),
        Trial::test("net_udp_and_tcp_to_itself_2_vcpus", || to_itself("2", &[])),
        Trial::test("net_udp_and_tcp_to_itself_1_vcpu", || to_itself("1", &[])),
        Trial::test("net_udp_and_tcp_to_itself_oblivious", || {
            to_itself("2", &["--no-activations"])
        }),
        Trial::test("net_udp_reaches_nothing_unpublished", || {
            // No flags: the server's bind is refused.
            activm_run(
                &std_guest("std-udp")?,
                &[],
                &["53", "127.0.0.1:9", "127.0.0.1:9"],
            )?
            .expect_code(1)?
            .stdout_has("std-udp: bind server: Permission denied")?;
            // A TCP publish of the same port does not publish UDP; and without a UDP
            // allowance no port 0 either.
            let publish_tcp = format!("{}:53", free_tcp_port()?);
            let publish_udp = format!("{}:53/udp", free_udp_port()?);
            activm_run(
                &std_guest("std-udp")?,
                &["--publish", &publish_tcp],
                &["53", "127.0.0.1:9", "127.0.0.1:9"],
            )?
            .expect_code(1)?
            .stdout_has("std-udp: bind server: Permission denied")?;
            activm_run(
                &std_guest("std-udp")?,
                &["--publish", &publish_udp, "--allow-connect", "127.0.0.1:9"],
                &["53", "127.0.0.1:9", "127.0.0.1:9"],
            )?
            .expect_code(1)?
            .stdout_has("std-udp: bind client: Permission denied")?;
            Ok(())
        }),
        Trial::test("net_udp_flags_are_checked", || {
            usage_error("--publish", "5353:53/sctp", "must be tcp or udp")?;
            usage_error("--publish", "0:53/udp", "is not a port")?;
            usage_error("--allow-connect", "10.0.0.1:9000/udp", "only loopback")?;
            usage_error("--allow-connect", "127.0.0.1/udp", "is not HOST:PORT")?;
            Ok(())
        }),
    ]
}
