//! Sockets for std guests (`devices/net.rs`): guests/apps/std-kv, a RESP key-value server,
//! driven by Debian's unmodified `redis-benchmark` and checked with `redis-cli`, with and
//! without activations; an outbound connection allowed with `--allow-connect`; and a guest
//! that reaches nothing it was not given.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};

use super::{activm_run, std_guests::std_guest, ACTIVM};

/// Installs Debian's redis-tools if `redis-benchmark` is missing: once per test process (the
/// tests that need it run in parallel, and two `apt-get`s at once fight over dpkg's lock), and
/// again while another process holds that lock, for up to a minute.
fn redis_tools() -> Result<(), Failed> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(install_redis_tools)
        .clone()
        .map_err(Failed::from)
}

fn install_redis_tools() -> Result<(), String> {
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if have("redis-benchmark") && have("redis-cli") {
            return Ok(());
        }
        let installed = Command::new("apt-get")
            .args(["install", "-y", "redis-tools"])
            .output()
            .map_err(|e| format!("redis-benchmark is missing and apt-get failed: {e}"))?;
        let stderr = String::from_utf8_lossy(&installed.stderr);
        if have("redis-benchmark") {
            return Ok(());
        }
        if !stderr.contains("lock") || Instant::now() >= deadline {
            return Err(format!(
                "redis-benchmark is missing (apt-get install -y redis-tools): {stderr}"
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, Failed> {
    let probe = TcpListener::bind("127.0.0.1:0")?;
    Ok(probe.local_addr()?.port())
}

fn redis_cli(port: u16, args: &[&str]) -> Result<String, Failed> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The guest, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_kv(port: u16, options: &[&str]) -> Result<Server, Failed> {
    let publish = format!("{port}:6379");
    let child = Command::new(ACTIVM)
        .arg("run")
        .arg(std_guest("std-kv")?)
        .args(["--publish", &publish, "--timeout", "300"])
        .args(options)
        .stdout(Stdio::null())
        .stderr(if options.contains(&"--stats") {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .spawn()?;
    let server = Server(child);
    let start = Instant::now();
    while redis_cli(port, &["ping"])? != "PONG" {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("std-kv did not answer PING within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}

/// `redis-benchmark`'s SET and GET (20,000 requests at 50 clients) and a round trip of our
/// own; the server still runs, for the caller to look at.
fn benchmark_then_round_trip(options: &'static [&'static str]) -> Result<Server, Failed> {
    redis_tools()?;
    let port = free_port()?;
    let server = start_kv(port, options)?;
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string()])
        .args(["-t", "set,get", "-n", "20000", "-c", "50", "-q"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    if !out.status.success() {
        let errors = String::from_utf8_lossy(&out.stderr);
        return Err(format!("redis-benchmark failed ({}): {errors}\n{text}", out.status).into());
    }
    for test in ["SET:", "GET:"] {
        let done = text
            .lines()
            .any(|l| l.trim_start().starts_with(test) && l.contains("requests per second"));
        if !done {
            return Err(format!("no {test} result from redis-benchmark:\n{text}").into());
        }
    }
    // The benchmark wrote `key:__rand_int__`; a round trip of our own.
    if redis_cli(port, &["get", "key:__rand_int__"])?.len() != 3 {
        return Err("redis-benchmark's SET left no 3-byte value".into());
    }
    if redis_cli(port, &["set", "activm", "proxy sockets"])? != "OK" {
        return Err("SET did not answer OK".into());
    }
    let got = redis_cli(port, &["get", "activm"])?;
    if got != "proxy sockets" {
        return Err(format!("GET answered {got:?}").into());
    }
    if redis_cli(port, &["incr", "n"])? != "1" || redis_cli(port, &["incr", "n"])? != "2" {
        return Err("INCR does not count".into());
    }
    Ok(server)
}

/// A server alone on the host serves the benchmark; its idle vCPUs offer their processors back
/// and the VMM, with nobody else to give them to, declines. A declined offer is no yield: the
/// guest must not ask for its processors again afterwards (before the fix, 12-22 asks in this
/// run, each waking the second vCPU for work the first would have taken). Its one ask is the
/// runtime's start; a second may come from an offer in flight on the other vCPU.
fn alone_asks_for_no_processors_it_kept() -> Result<(), Failed> {
    let mut server = benchmark_then_round_trip(&["--vcpus", "2", "--stats"])?;
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGINT) };
    let mut stats = String::new();
    if let Some(mut stderr) = server.0.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut stats)?;
    }
    let count = |label: &str| -> Result<u64, Failed> {
        stats
            .split(label)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("no `{label}` in --stats:\n{stats}").into())
    };
    let asks = count("asks for processors (sa_setconcurrency)=")?;
    let declined = count("processor offers declined=")?;
    if asks > 2 || count("yields=")? != 0 {
        return Err(format!("{asks} asks after {declined} declined offers\n{stats}").into());
    }
    Ok(())
}

/// Requests on one connection with idle gaps: the VMM's net thread has stopped polling and the
/// vCPUs halt between them, so each reply goes out by the transmit doorbell (the store to the
/// `net` slot, an ioeventfd) and each request wakes a halted vCPU. Every reply must come.
fn answers_after_idle_gaps(options: &'static [&'static str]) -> Result<(), Failed> {
    use std::io::{BufRead, BufReader, Write};
    redis_tools()?;
    let port = free_port()?;
    let _server = start_kv(port, options)?;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    for i in 0..6 {
        std::thread::sleep(Duration::from_millis(if i % 2 == 0 { 200 } else { 3 }));
        let value = format!("v{i}");
        let set = format!(
            "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n{value}\r\n",
            value.len()
        );
        stream.write_all(set.as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line != "+OK\r\n" {
            return Err(format!("request {i}: SET answered {line:?}").into());
        }
        stream.write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")?;
        let (mut head, mut body) = (String::new(), String::new());
        reader.read_line(&mut head)?;
        reader.read_line(&mut body)?;
        if head != format!("${}\r\n", value.len()) || body != format!("{value}\r\n") {
            return Err(format!("request {i}: GET answered {head:?} {body:?}").into());
        }
    }
    Ok(())
}

/// std-kv beside a batch guest in one activm on 2 processors: between requests the idle server
/// gives its processors back to the batch guest, even its last one (its `accept` and reads stay
/// armed: `SHARED_FEATURE_YIELD_NET`), and a request that comes while it holds none makes the
/// VMM want a processor for it. Every request is answered, and at least one asked for a
/// processor (`--stats`).
fn gives_back_processors_beside_a_batch_guest() -> Result<(), Failed> {
    use std::io::{BufRead, BufReader, Write};
    let port = free_port()?;
    let dir = super::TempDir::new("kv-beside")?;
    let config = dir.file(
        "beside.toml",
        &format!(
            "pcpus = 2\ntimeout = 9\n\n[[guest]]\nname = \"kv\"\nimage = '{}'\nvcpus = 2\n\
             publish = [\"{port}:6379\"]\n\n[[guest]]\nname = \"batch\"\nimage = '{}'\n\
             vcpus = 2\nargs = [\"nbody-for\", \"1024\", \"8000\", \"2\"]\n",
            std_guest("std-kv")?.display(),
            super::guest("nbody")?.display()
        ),
    )?;
    let run = std::thread::spawn(move || {
        Command::new(ACTIVM)
            .args([std::ffi::OsStr::new("run"), config.as_os_str()])
            .arg("--stats")
            .output()
    });
    let start = Instant::now();
    let stream = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if start.elapsed() < Duration::from_secs(6) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("std-kv never listened: {e}").into()),
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut answered = 0;
    for i in 0..5 {
        // Long enough idle for the server to give its processors back (1 ms, then a yield).
        std::thread::sleep(Duration::from_millis(300));
        writer.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line != "+PONG\r\n" {
            return Err(format!("request {i}: PING answered {line:?}").into());
        }
        answered += 1;
    }
    drop((writer, reader));
    let out = run.join().map_err(|_| "the activm thread panicked")??;
    // The guests' output (stdout) and the VMM's (`--stats`, on stderr).
    let stdout = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !stdout.contains("[batch] RESULT nbody") {
        return Err(format!("the batch guest did not finish\n{stdout}").into());
    }
    let asked: u64 = stdout
        .lines()
        .filter(|l| l.starts_with("[kv] "))
        .find_map(|l| l.split("socket reports that asked for a processor=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no socket report count in --stats\n{stdout}"))?;
    if answered != 5 || asked == 0 {
        return Err(format!(
            "{answered} of 5 answered; reports that asked for a processor: {asked}\n{stdout}"
        )
        .into());
    }
    Ok(())
}

/// `std-kv ping` against a listener of the test's own that answers `+PONG`.
fn connects_only_where_allowed() -> Result<(), Failed> {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        let mut request = [0u8; 64];
        let _ = conn.read(&mut request)?;
        conn.write_all(b"+PONG\r\n")
    });
    activm_run(
        &std_guest("std-kv")?,
        &["--allow-connect", &addr],
        &["ping", &addr],
    )?
    .expect_code(0)?
    .stdout_has(&format!("std-kv: {addr} answered +PONG"))?;
    server
        .join()
        .map_err(|_| "the listener thread panicked")??;
    // Not allowed: refused by the VMM before any host socket exists.
    let elsewhere = format!("127.0.0.1:{}", free_port()?);
    activm_run(
        &std_guest("std-kv")?,
        &["--allow-connect", &elsewhere],
        &["ping", &addr],
    )?
    .expect_code(1)?
    .stdout_has("Permission denied")?;
    Ok(())
}

/// `std-kv blast`: every byte arrives, in order, then the end of the stream, both from a
/// stream closed non-blocking (the VMM sends the rest after `close`) and from one left open
/// at `std::process::exit` (sent before the VMM closes it). The first reader is slow on
/// purpose, so the host socket is full when the guest closes; the second stream's 64 KiB fit
/// the host socket's buffers (the VMM sends once at exit and does not wait).
fn last_bytes_arrive_after_close_and_exit() -> Result<(), Failed> {
    use std::io::Read;
    const CLOSED: usize = 8 << 20;
    const OPEN: usize = 64 << 10;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    let reader = std::thread::spawn(move || -> Result<(), String> {
        for (which, bytes) in [("closed", CLOSED), ("left open at exit", OPEN)] {
            let (mut conn, _) = listener.accept().map_err(|e| e.to_string())?;
            let mut got = 0usize;
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let n = conn.read(&mut chunk).map_err(|e| format!("{which}: {e}"))?;
                if n == 0 {
                    break;
                }
                if let Some(i) = (0..n).find(|&i| chunk[i] != ((got + i) % 251) as u8) {
                    return Err(format!("{which}: byte {} is wrong", got + i));
                }
                got += n;
            }
            if got != bytes {
                return Err(format!("{which}: {got} of {bytes} bytes arrived"));
            }
        }
        Ok(())
    });
    activm_run(
        &std_guest("std-kv")?,
        &["--allow-connect", &addr],
        &["blast", &addr, &CLOSED.to_string(), &OPEN.to_string()],
    )?
    .expect_code(0)?
    .stdout_has(&format!("std-kv: sent {CLOSED} and {OPEN} bytes"))?;
    reader.join().map_err(|_| "the reader thread panicked")??;
    Ok(())
}

/// std-kv (latency-critical, 2 vCPUs) and an N-body guest on 2 processors, five times over: a
/// burst of requests on 32 connections (4 in flight on each) ends at once, and within 500 ms the
/// server holds at most one processor (`activm ctl list`), the other given back to the batch
/// guest that wants it. Until 2026-11-29 a vCPU whose last halt came within 20 ms of its
/// previous offer (`NET_OFFER_PACE_NS`) offered none and kept its processor until more requests
/// came: with both vCPUs so, the batch guest starved (`cargo xtask bench kv`: 1 run in 6).
fn processors_come_back_after_a_burst() -> Result<(), Failed> {
    let port = free_port()?;
    let dir = super::TempDir::new("kv-burst")?;
    let socket = dir.0.join("ctl.sock");
    let config = dir.file(
        "burst.toml",
        &format!(
            "pcpus = 2\ntimeout = 12\n\n[[guest]]\nname = \"kv\"\nimage = '{}'\nvcpus = 2\n\
             latency_critical = true\npublish = [\"{port}:6379\"]\n\n[[guest]]\nname = \"batch\"\n\
             image = '{}'\nvcpus = 2\nargs = [\"nbody-for\", \"1024\", \"10000\", \"2\"]\n",
            std_guest("std-kv")?.display(),
            super::guest("nbody")?.display()
        ),
    )?;
    let mut run = Command::new(ACTIVM)
        .arg("run")
        .arg("--ctl")
        .arg(&socket)
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| -> Result<(), Failed> {
        for round in 0..5 {
            let answered = burst(port, 32, Duration::from_millis(200))?;
            let stopped = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(50));
                let list = Command::new(ACTIVM)
                    .arg("ctl")
                    .arg(&socket)
                    .arg("list")
                    .output()?;
                let list: serde_json::Value = serde_json::from_slice(&list.stdout)
                    .map_err(|e| format!("activm ctl list: {e}"))?;
                let kv = &list["guests"][0];
                let held = kv["vcpus"]
                    .as_array()
                    .ok_or_else(|| format!("no vCPU states in {list}"))?
                    .iter()
                    .filter(|state| *state == "running")
                    .count();
                if kv["name"] == "kv" && held <= 1 {
                    break;
                }
                // Given back within 21 ms (the pace, then the idle deadline); 500 ms allows for
                // a loaded host.
                if stopped.elapsed() > Duration::from_millis(500) {
                    return Err(format!(
                        "round {round}: {answered} PINGs answered, then the server held \
                         {held} processors 500 ms after its clients stopped: {kv}"
                    )
                    .into());
                }
            }
        }
        Ok(())
    })();
    let _ = run.kill();
    let _ = run.wait();
    result
}

/// `clients` connections to `port` each send PINGs, 4 at a time, for `time`, all stopping
/// together: the PINGs answered.
fn burst(port: u16, clients: usize, time: Duration) -> Result<u64, Failed> {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let start = Instant::now();
    let mut streams = Vec::new();
    while streams.len() < clients {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => streams.push(stream),
            Err(_) if start.elapsed() < Duration::from_secs(6) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("std-kv never listened: {e}").into()),
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let clients: Vec<_> = streams
            .into_iter()
            .map(|stream| {
                let stop = &stop;
                scope.spawn(move || -> Result<u64, String> {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .map_err(|e| e.to_string())?;
                    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
                    let mut reader = BufReader::new(stream);
                    let mut answered = 0;
                    while !stop.load(Ordering::Relaxed) {
                        writer
                            .write_all(&b"*1\r\n$4\r\nPING\r\n".repeat(4))
                            .map_err(|e| e.to_string())?;
                        for _ in 0..4 {
                            let mut line = String::new();
                            reader.read_line(&mut line).map_err(|e| e.to_string())?;
                            if line != "+PONG\r\n" {
                                return Err(format!("PING answered {line:?}"));
                            }
                            answered += 1;
                        }
                    }
                    Ok(answered)
                })
            })
            .collect();
        std::thread::sleep(time);
        stop.store(true, Ordering::Relaxed);
        let mut answered = 0;
        for client in clients {
            answered += client.join().map_err(|_| "a client thread panicked")??;
        }
        Ok(answered)
    })
}

pub fn tests() -> Vec<Trial> {
    vec![
        Trial::test("std_kv_last_bytes_arrive_after_close_and_exit", || {
            last_bytes_arrive_after_close_and_exit()
        }),
        Trial::test(
            "std_kv_serves_redis_benchmark_and_asks_for_no_processors_it_kept",
            alone_asks_for_no_processors_it_kept,
        ),
        Trial::test("std_kv_serves_redis_benchmark_without_activations", || {
            benchmark_then_round_trip(&["--vcpus", "2", "--no-activations"]).map(drop)
        }),
        Trial::test(
            "std_kv_beside_a_batch_guest_gives_back_its_processors_and_answers",
            gives_back_processors_beside_a_batch_guest,
        ),
        Trial::test(
            "std_kv_gives_back_the_processors_of_a_burst_beside_a_batch_guest",
            processors_come_back_after_a_burst,
        ),
        Trial::test("std_kv_answers_after_idle_gaps", || {
            answers_after_idle_gaps(&["--vcpus", "2"])
        }),
        Trial::test("std_kv_answers_after_idle_gaps_without_activations", || {
            answers_after_idle_gaps(&["--vcpus", "2", "--no-activations"])
        }),
        Trial::test("std_kv_answers_after_idle_gaps_host_sched", || {
            answers_after_idle_gaps(&["--vcpus", "2", "--host-sched"])
        }),
        Trial::test("a_guest_reaches_nothing_unpublished", || {
            // No --publish: the bind is refused (EACCES).
            activm_run(&std_guest("std-kv")?, &[], &[])?
                .expect_code(1)?
                .stdout_has("cannot listen on port 6379: Permission denied")?;
            // Another port than the published one: refused as well.
            let publish = format!("{}:7000", free_port()?);
            activm_run(&std_guest("std-kv")?, &["--publish", &publish], &["6379"])?
                .expect_code(1)?
                .stdout_has("cannot listen on port 6379: Permission denied")?;
            Ok(())
        }),
        Trial::test(
            "a_guest_connects_only_where_allowed",
            connects_only_where_allowed,
        ),
        Trial::test("publish_and_allow_connect_are_checked", || {
            let out = Command::new(ACTIVM)
                .arg("run")
                .arg(std_guest("std-kv")?)
                .args(["--allow-connect", "10.0.0.1:80"])
                .output()?;
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.code() != Some(2) || !err.contains("only loopback addresses") {
                return Err(format!("{:?}: {err}", out.status.code()).into());
            }
            Ok(())
        }),
    ]
}
