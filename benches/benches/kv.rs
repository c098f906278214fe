//! A key-value server on activm's socket proxy against Redis itself: guests/apps/std-kv (an
//! ordinary std program, one thread per connection) driven by Debian's unmodified
//! `redis-benchmark` (GET and SET, 50 clients, without and with 16-deep pipelining), in three
//! modes: scheduler activations (the default), host-scheduled vCPUs (`--host-sched`, plain
//! KVM threads) and activm's time slicer (`--no-activations`), on 2 vCPUs (`ACTIVM_KV_VCPUS`),
//! then with activations on 1 vCPU; and the native anchor, Debian's
//! `redis-server` on the host (no persistence), measured in the same run. Throughput and
//! p50/p99 latency from `redis-benchmark --csv`; ratios against redis-server. "CPU us/req": the
//! server process's host CPU time (user + system, `/proc/PID/stat`) over the run per request,
//! the cost that decides throughput on a host whose CPUs the clients share.
//!
//! Then the same beside a batch guest (`nbody nbody-for`, N-body stepping on 2 vCPUs) on the
//! same 2 CPUs: both guests in one activm (`pcpus = 2`, the server `latency_critical`) in each
//! mode, and redis-server beside the batch guest run alone (host-scheduled). Beside the
//! latency-critical server the batch guest's vCPU threads run at the host's idle priority
//! (`batch_sched_idle`, the default without `host_sched`); two more rows show host-sched with
//! the batch guest at that priority too (what a plain KVM user can do with `chrt --idle`) and
//! activations without it. First, what an
//! idle server costs: the batch guest's steps/s alone and beside an idle std-kv.
//!
//! The table alone gives each figure's median over rounds (`ACTIVM_KV_ROUNDS`, default 3), each
//! round running every server in turn; ratios are of those medians. The rows beside the batch
//! guest are one round.
//!
//! `cargo xtask bench kv`; `ACTIVM_BENCH_QUICK=1` for fewer requests and one round; `ACTIVM_KV_ROOT=DIR`
//! takes `target/release/activm` and the guests from DIR's tree instead. Installs redis-tools and
//! redis-server with apt-get when missing. Everything stays on 127.0.0.1.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use activm_benches::repo_root;

/// A server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let probe = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    probe
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "ping"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
}

fn start(mut cmd: Command, port: u16) -> Result<Server, String> {
    let server = Server(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{cmd:?}: {e}"))?,
    );
    let t = Instant::now();
    while !ping(port) {
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("{cmd:?} does not answer PING"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}

/// Debian's own redis-server on the host (no persistence), the native anchor.
fn start_redis_server(port: u16) -> Result<Server, String> {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"]);
    start(cmd, port)
}

/// Host CPU time (user + system) `pid` has used, in microseconds (`/proc/PID/stat`).
fn cpu_us(pid: u32) -> Option<f64> {
    cpu_us_of(&format!("/proc/{pid}/stat"))
}

/// The user + system time in a `stat` file of `/proc`, in microseconds.
fn cpu_us_of(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which ends with the last ')': state is field 3, utime 14.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 * 1e6 / hz as f64)
}

/// Host CPU time (user + system) of the threads of `pid` whose name starts with `prefix`, in
/// microseconds (`/proc/PID/task/*/stat`).
fn threads_cpu_us(pid: u32, prefix: &str) -> Option<f64> {
    let mut total = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.starts_with(prefix) {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            total += cpu_us_of(&format!("/proc/{pid}/task/{tid}/stat"))?;
        }
    }
    Some(total)
}

/// One run beside the batch guest: the row's figures, and the host CPUs the batch guest's
/// vCPU threads (`batch` = (pid, thread name prefix)) used during it on average.
fn measure_beside(
    port: u16,
    test: &str,
    pipeline: u32,
    requests: u32,
    batch: (u32, &str),
) -> Result<(Measured, f64), String> {
    let start = (Instant::now(), threads_cpu_us(batch.0, batch.1));
    let m = measure(port, test, pipeline, requests, None)?;
    let used = threads_cpu_us(batch.0, batch.1);
    let cpus = match (start.1, used) {
        (Some(b), Some(a)) => (a - b) / (start.0.elapsed().as_secs_f64() * 1e6),
        _ => f64::NAN,
    };
    Ok((m, cpus))
}

/// One redis-benchmark run: (requests/s, p50 ms, p99 ms), and the server's host CPU per
/// request in us when `server` is its process (NaN otherwise).
fn measure(
    port: u16,
    test: &str,
    pipeline: u32,
    requests: u32,
    server: Option<u32>,
) -> Result<Measured, String> {
    let before = server.and_then(cpu_us);
    let m = redis_benchmark(port, test, pipeline, requests)?;
    let after = server.and_then(cpu_us);
    let cpu = match (before, after) {
        (Some(b), Some(a)) => (a - b) / f64::from(requests),
        _ => f64::NAN,
    };
    Ok(Measured {
        rps: m.0,
        p50: m.1,
        p99: m.2,
        cpu,
    })
}

/// Rounds of the table alone: `ACTIVM_KV_ROUNDS`, else 3 (1 with `ACTIVM_BENCH_QUICK`).
fn rounds(quick: bool) -> usize {
    std::env::var("ACTIVM_KV_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(if quick { 1 } else { 3 })
}

/// Each figure's median over `runs` (one figure per round; NaN where it was not measured).
fn median(runs: &[Measured]) -> Measured {
    let of = |pick: fn(&Measured) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    Measured {
        rps: of(|m| m.rps),
        p50: of(|m| m.p50),
        p99: of(|m| m.p99),
        cpu: of(|m| m.cpu),
    }
}

/// One row's figures.
#[derive(Clone, Copy)]
struct Measured {
    rps: f64,
    p50: f64,
    p99: f64,
    /// Host CPU of the server process per request, us (NaN: not measured).
    cpu: f64,
}

/// One redis-benchmark run: (requests/s, p50 ms, p99 ms).
fn redis_benchmark(
    port: u16,
    test: &str,
    pipeline: u32,
    requests: u32,
) -> Result<(f64, f64, f64), String> {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", test, "-c", "50", "--csv"])
        .args(["-n", &requests.to_string(), "-P", &pipeline.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("\"{}\"", test.to_uppercase())))
        .ok_or_else(|| format!("no {test} row in {text:?}"))?;
    let f: Vec<f64> = row
        .split(',')
        .skip(1)
        .map(|v| v.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    match f.as_slice() {
        [rps, _avg, _min, p50, _p95, p99, ..] => Ok((*rps, *p50, *p99)),
        _ => Err(format!("short row {row:?}")),
    }
}

fn ensure_tools() -> Result<(), String> {
    let have = |t: &str| Command::new(t).arg("--version").output().is_ok();
    if !(have("redis-benchmark") && have("redis-server")) {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "redis-tools", "redis-server"])
            .status();
    }
    if have("redis-benchmark") && have("redis-server") {
        Ok(())
    } else {
        Err(
            "redis-benchmark / redis-server missing (apt-get install -y redis-tools redis-server)"
                .into(),
        )
    }
}

fn main() {
    if let Err(e) = run() {
        println!("kv: {e}");
    }
}

fn run() -> Result<(), String> {
    ensure_tools()?;
    let quick = std::env::var_os("ACTIVM_BENCH_QUICK").is_some();
    let requests = if quick { 20_000 } else { 100_000 };
    // ACTIVM_KV_ROOT: another tree's built VMM and guests (an earlier build, to compare).
    let root = std::env::var_os("ACTIVM_KV_ROOT").map_or_else(repo_root, Into::into);
    let activm = root.join("target/release/activm");
    let kv = root.join("guests/target/x86_64-activm-std/release/std-kv");
    if !kv.is_file() || !activm.is_file() {
        return Err(
            "build first: cargo build --release; cargo xtask build-guests --release".into(),
        );
    }
    let vcpus = std::env::var("ACTIVM_KV_VCPUS").unwrap_or_else(|_| "2".into());
    // The last row: the same server on one vCPU (its one hot loop is redis-server's too), where
    // no wake-up crosses vCPUs.
    let modes: [(&str, &[&str], &str); 4] = [
        ("activm, activations", &[], &vcpus),
        ("activm, --host-sched", &["--host-sched"], &vcpus),
        ("activm, --no-activations", &["--no-activations"], &vcpus),
        ("activm, activ., 1 vCPU", &[], "1"),
    ];
    let tests = [("get", 1), ("set", 1), ("get", 16), ("set", 16)];
    println!("std-kv on activm ({vcpus} vCPUs) vs host redis-server; redis-benchmark -c 50 -n {requests} --csv; shared 2-CPU host; medians of {} rounds", rounds(quick));
    println!(
        "{:<26} {:<10} {:>12} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "server",
        "test",
        "req/s",
        "p50 ms",
        "p99 ms",
        "x redis",
        "p99/redis",
        "CPU us/req",
        "x redis"
    );
    // Per server (redis-server, then each mode) and test: one figure per round. Every round
    // runs every server, so a slow minute of the host falls on all of them alike.
    let mut runs = vec![vec![Vec::new(); tests.len()]; 1 + modes.len()];
    for _ in 0..rounds(quick) {
        {
            let port = free_port()?;
            let server = start_redis_server(port)?;
            for (i, &(test, pipeline)) in tests.iter().enumerate() {
                runs[0][i].push(measure(
                    port,
                    test,
                    pipeline,
                    requests,
                    Some(server.0.id()),
                )?);
            }
        }
        for (k, (_, flags, vcpus)) in modes.iter().enumerate() {
            let port = free_port()?;
            let mut cmd = Command::new(&activm);
            cmd.arg("run")
                .arg(&kv)
                .args(["--vcpus", vcpus, "--timeout", "600"])
                .args(["--publish", &format!("{port}:6379")])
                .args(*flags);
            let server = start(cmd, port)?;
            for (i, &(test, pipeline)) in tests.iter().enumerate() {
                let m = measure(port, test, pipeline, requests, Some(server.0.id()))?;
                runs[k + 1][i].push(m);
            }
        }
    }
    let anchor: Vec<Measured> = runs[0].iter().map(|r| median(r)).collect();
    let names = std::iter::once("redis-server (host)").chain(modes.iter().map(|m| m.0));
    for (name, per_test) in names.zip(&runs) {
        for (i, &(test, pipeline)) in tests.iter().enumerate() {
            row(name, test, pipeline, median(&per_test[i]), anchor[i]);
        }
    }
    beside_nbody(&activm, &kv, &root, requests)
}

/// N-body steps/s of a 2-vCPU batch guest alone and beside an idle std-kv (2 vCPUs, its
/// `accept` waiting, no clients) in one activm on 2 CPUs, with activations and host-scheduled:
/// what an idle server costs its neighbour.
fn idle_server_beside_batch(
    activm: &std::path::Path,
    kv: &std::path::Path,
    nbody: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(), String> {
    println!("a batch guest (nbody, 2 threads, 2 vCPUs, 3 s) beside an idle std-kv (2 vCPUs, no clients), one activm on 2 CPUs");
    println!(
        "{:<26} {:>14} {:>14} {:>8}",
        "mode", "alone steps/s", "beside idle", "ratio"
    );
    for (name, machine) in [("activations", ""), ("host-sched", "host_sched = true\n")] {
        let mut rates = [0.0f64; 2];
        for (i, with_kv) in [false, true].into_iter().enumerate() {
            let port = free_port()?;
            let server = if with_kv {
                format!(
                    "[[guest]]\nname = \"kv\"\nimage = {kv:?}\nvcpus = 2\npublish = [\"{port}:6379\"]\n\n"
                )
            } else {
                String::new()
            };
            let text = format!(
                "pcpus = 2\ntimeout = 6\n{machine}\n{server}[[guest]]\nname = \"batch\"\n\
                 image = {nbody:?}\nvcpus = 2\nargs = [\"nbody-for\", \"1024\", \"3000\", \"2\"]\n"
            );
            let config = dir.join("idle-beside.toml");
            std::fs::write(&config, text).map_err(|e| e.to_string())?;
            let out = Command::new(activm)
                .arg("run")
                .arg(&config)
                .output()
                .map_err(|e| e.to_string())?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            rates[i] = stdout
                .lines()
                .filter(|l| l.contains("RESULT nbody"))
                .find_map(|l| l.split("steps_per_s=").nth(1))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .ok_or_else(|| format!("{name}: no N-body result in {stdout:?}"))?;
        }
        println!(
            "{name:<26} {:>14.1} {:>14.1} {:>7.2}x",
            rates[0],
            rates[1],
            rates[1] / rates[0]
        );
    }
    Ok(())
}

/// GET/SET -P 1 with an N-body guest beside the server on the same 2 CPUs.
fn beside_nbody(
    activm: &std::path::Path,
    kv: &std::path::Path,
    root: &std::path::Path,
    requests: u32,
) -> Result<(), String> {
    let nbody = root.join("guests/target/x86_64-activm/release/nbody");
    if !nbody.is_file() {
        return Err("build first: cargo xtask build-guests --release".into());
    }
    let dir = std::env::temp_dir().join(format!("activm-kv-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    idle_server_beside_batch(activm, kv, &nbody, &dir)?;
    let batch_ms = 600_000;
    let tests = [("get", 1), ("set", 1)];
    println!(
        "beside a batch guest (nbody nbody-for 1024 bodies, 2 threads, 2 vCPUs) on the same 2 CPUs; \
         last column: host CPUs the batch guest's vCPU threads used during the run"
    );
    let mut anchor = Vec::new();
    {
        let mut batch = Command::new(activm);
        batch
            .arg("run")
            .arg(&nbody)
            .args(["--vcpus", "2", "--host-sched", "--timeout", "900", "--"])
            .args(["nbody-for", "1024", &batch_ms.to_string(), "2"]);
        let batch = Server(
            batch
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?,
        );
        let port = free_port()?;
        let _server = start_redis_server(port)?;
        for &(test, pipeline) in &tests {
            let (m, cpus) =
                measure_beside(port, test, pipeline, requests, (batch.0.id(), "g0-vcpu"))?;
            row_beside("redis-server + nbody", test, pipeline, m, m, cpus);
            anchor.push(m);
        }
    }
    let modes = [
        ("activm + nbody, activ.", "", ""),
        ("activm + nbody, host-sched", "host_sched = true\n", ""),
        (
            "  host-sched, batch idle",
            "host_sched = true\nbatch_sched_idle = true\n",
            "",
        ),
        ("activm + nbody, no-activ.", "", "no_activations = true\n"),
        ("  activ., batch not idle", "batch_sched_idle = false\n", ""),
    ];
    for (name, machine, guest) in modes {
        let port = free_port()?;
        let config = dir.join("beside.toml");
        let text = format!(
            "pcpus = 2\ntimeout = 900\n{machine}\n\
             [[guest]]\nname = \"kv\"\nimage = {kv:?}\nvcpus = 2\nlatency_critical = true\n\
             publish = [\"{port}:6379\"]\n{guest}\n\
             [[guest]]\nname = \"batch\"\nimage = {nbody:?}\nvcpus = 2\n\
             args = [\"nbody-for\", \"1024\", \"{batch_ms}\", \"2\"]\n{guest}"
        );
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(activm);
        cmd.arg("run").arg(&config);
        let server = start(cmd, port)?;
        for (i, &(test, pipeline)) in tests.iter().enumerate() {
            let (m, cpus) =
                measure_beside(port, test, pipeline, requests, (server.0.id(), "g1-vcpu"))?;
            row_beside(name, test, pipeline, m, anchor[i], cpus);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn row(name: &str, test: &str, pipeline: u32, m: Measured, base: Measured) {
    // The CPU columns only where measured (not beside the batch guest, whose process it shares).
    let cpu = if m.cpu.is_nan() {
        format!("{:>10} {:>10}", "-", "-")
    } else {
        format!("{:>10.1} {:>9.2}x", m.cpu, m.cpu / base.cpu)
    };
    print_row(name, test, pipeline, m, base, &cpu);
}

/// A row beside the batch guest: its last column the host CPUs the batch guest used.
fn row_beside(name: &str, test: &str, pipeline: u32, m: Measured, base: Measured, cpus: f64) {
    let cpu = format!("{:>10} {:>10.2}", "-", cpus);
    print_row(name, test, pipeline, m, base, &cpu);
}

fn print_row(name: &str, test: &str, pipeline: u32, m: Measured, base: Measured, cpu: &str) {
    let label = format!("{} -P {pipeline}", test.to_uppercase());
    println!(
        "{name:<26} {label:<10} {:>12.0} {:>9.3} {:>9.3} {:>9.2}x {:>9.2}x {cpu}",
        m.rps,
        m.p50,
        m.p99,
        m.rps / base.rps,
        m.p99 / base.p99
    );
}
