//! The socket calls ordinary std programs use (issue 11): `std-kv netopts` (guests/apps/std-kv/
//! src/netopts.rs) against a peer played by this test: `localhost`, read and write timeouts
//! (timings as lower bounds only, measured in the guest), a 1 ms read timeout racing 200 bytes
//! sent a few hundred microseconds apart, `try_clone` from two threads, `connect_timeout` to a
//! listening and to a refused port, `poll` of a listener that times out twice (the VMM's `poll`
//! and `cancel`) and then sees a connection. With and without activations, and on one vCPU.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use super::{activm_run, std_guests::std_guest};

fn expect_line(r: &mut BufReader<TcpStream>, want: &str) -> Result<(), String> {
    let mut l = String::new();
    r.read_line(&mut l)
        .map_err(|e| format!("waiting for {want:?}: {e}"))?;
    if l.trim_end() != want {
        return Err(format!("the guest sent {l:?}, not {want:?}"));
    }
    Ok(())
}

/// The peer: answers each request of the guest's cases, then stops reading (the write timeout
/// case). Returns the streams, to be dropped after the guest exited.
fn peer(listener: TcpListener, published: u16) -> Result<Vec<TcpStream>, String> {
    let e = |e: std::io::Error| e.to_string();
    let (a, _) = listener.accept().map_err(e)?;
    a.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(e)?;
    let mut r = BufReader::new(a.try_clone().map_err(e)?);
    let mut w = a.try_clone().map_err(e)?;
    expect_line(&mut r, "go")?;
    std::thread::sleep(Duration::from_millis(100));
    w.write_all(b"hello\n").map_err(e)?;
    expect_line(&mut r, "race")?;
    for i in 0..200u32 {
        std::thread::sleep(Duration::from_micros(u64::from(i % 5) * 500));
        w.write_all(&[i as u8]).map_err(e)?;
    }
    expect_line(&mut r, "ping")?;
    w.write_all(b"pong\n").map_err(e)?;
    expect_line(&mut r, "again")?;
    w.write_all(b"again-ok\n").map_err(e)?;
    let (c, _) = listener.accept().map_err(e)?;
    c.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(e)?;
    let mut rc = BufReader::new(c.try_clone().map_err(e)?);
    expect_line(&mut rc, "second")?;
    (&c).write_all(b"second-ok\n").map_err(e)?;
    expect_line(&mut r, "listen")?;
    let d = TcpStream::connect(("127.0.0.1", published)).map_err(e)?;
    expect_line(&mut r, "stall")?;
    Ok(vec![a, c, d])
}

fn net_opts(options: &'static [&'static str]) -> Result<(), Failed> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let refused = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let published = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let peer = std::thread::spawn(move || peer(listener, published));
    let publish = format!("{published}:7000");
    let allow = [format!("127.0.0.1:{port}"), format!("127.0.0.1:{refused}")];
    let mut args: Vec<&str> = options.to_vec();
    args.extend(["--allow-connect", &allow[0], "--allow-connect", &allow[1]]);
    args.extend(["--publish", &publish]);
    let run = activm_run(
        &std_guest("std-kv")?,
        &args,
        &["netopts", &port.to_string(), &refused.to_string(), "7000"],
    )?;
    // A guest that failed leaves the peer waiting: its output says why.
    run.expect_code(0)?
        .stdout_has(&format!(
            "netopts: localhost:{port} connected to 127.0.0.1:{port}"
        ))?
        .stdout_has("netopts: read timed out (WouldBlock) after >= 200 ms")?
        .stdout_has("netopts: read in time")?
        .stdout_has("netopts: race: 200 bytes in order")?
        .stdout_has("netopts: try_clone: the clone's thread read pong")?
        .stdout_has("netopts: connect_timeout connected")?
        .stdout_has("netopts: connect_timeout refused: Connection refused")?
        .stdout_has("netopts: poll of a listener: 0 twice after >= 150 ms, then POLLIN")?
        .stdout_has("netopts: write timed out (WouldBlock) after >= 300 ms")?
        .stdout_has("netopts: done")?;
    let streams = peer.join().map_err(|_| "the peer thread panicked")?;
    drop(streams?);
    Ok(())
}

pub fn tests() -> Vec<Trial> {
    vec![
        Trial::test(
            "std_net_opts_timeouts_clone_connect_timeout_localhost",
            || net_opts(&["--vcpus", "2"]),
        ),
        Trial::test("std_net_opts_without_activations", || {
            net_opts(&["--vcpus", "2", "--no-activations"])
        }),
        Trial::test("std_net_opts_one_vcpu", || net_opts(&["--vcpus", "1"])),
    ]
}
