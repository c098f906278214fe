//! Pieces of the thread benchmarks (`benches/threads.rs`): the result-line format the three
//! implementations share, running a host program with a time limit, building the Go baseline,
//! and table formatting.
//!
//! Every implementation (host NPTL `baselines/nptl.rs`, Go `baselines/go`, activm guest
//! `guests/apps/threadbench`) takes `OP key=value ...` and prints one line
//! `BENCH OP v1 v2 ...`: one value per trial, in nanoseconds (per operation, or the trial's
//! total time for `create` and `contention`). Medians and percentiles are computed here, once,
//! for all of them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The per-trial values of the `BENCH op ...` line in `output`.
pub fn parse_bench(output: &str, op: &str) -> Result<Vec<f64>, String> {
    let line = output
        .lines()
        .map(str::trim)
        .find(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some("BENCH") && words.next() == Some(op)
        })
        .ok_or_else(|| format!("no `BENCH {op}` line in the output{}", tail(output)))?;
    let values: Result<Vec<f64>, _> = line.split_whitespace().skip(2).map(str::parse).collect();
    match values {
        Ok(v) if !v.is_empty() && v.iter().all(|x| x.is_finite() && *x >= 0.0) => Ok(v),
        _ => Err(format!("malformed result line {line:?}")),
    }
}

/// The last lines of `output`, for error messages (empty if there is no output).
pub fn tail(output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let from = lines.len().saturating_sub(3);
    format!(": ...{}", lines[from..].join(" | "))
}

/// Run `cmd` to its end or until `limit`, whichever is first; its stdout, or why it failed.
pub fn run_with_limit(cmd: &mut Command, limit: Duration) -> Result<String, String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                // Only our own child, by its handle.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Err(e) => return Err(format!("waiting for {name}: {e}")),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    match status {
        None => Err(format!("timed out after {} s", limit.as_secs())),
        Some(s) if s.success() => Ok(out),
        Some(s) => Err(format!("{name} failed ({s}){}", tail(&(out + &err)))),
    }
}

/// A value for the table: about four significant digits, no exponent.
pub fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A ratio for the table: `0.012x`, `0.53x`, `12.4x`.
pub fn fmt_ratio(r: f64) -> String {
    if r < 0.1 {
        format!("{r:.3}x")
    } else if r < 10.0 {
        format!("{r:.2}x")
    } else {
        format!("{r:.1}x")
    }
}

/// Build the Go baseline into target/threadbench-go; its path, or why it cannot be built.
pub fn build_go(root: &Path) -> Result<PathBuf, String> {
    let go = std::env::var_os("GO")
        .map(PathBuf::from)
        .or_else(|| {
            let local = PathBuf::from("/usr/local/go/bin/go");
            local.is_file().then_some(local)
        })
        .unwrap_or_else(|| PathBuf::from("go"));
    let out_dir = root.join("target/threadbench-go");
    let exe = out_dir.join("threadbench");
    let mut cmd = Command::new(&go);
    cmd.current_dir(root.join("benches/baselines/go"))
        .args(["build", "-o"])
        .arg(&exe)
        .arg(".")
        // Standard library only: no module downloads, no toolchain switch.
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod");
    if std::env::var_os("GOCACHE").is_none() && std::env::var_os("HOME").is_none() {
        cmd.env("GOCACHE", out_dir.join("cache"));
    }
    run_with_limit(&mut cmd, Duration::from_secs(300))
        .map_err(|e| format!("Go baseline did not build ({}): {e}", go.display()))?;
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_named_line() {
        let out = "INFO x\nBENCH yield 1.5 2.0\nBENCH mutex 3\n";
        assert_eq!(parse_bench(out, "mutex").unwrap(), vec![3.0]);
        assert_eq!(parse_bench(out, "yield").unwrap(), vec![1.5, 2.0]);
        assert!(parse_bench(out, "create").is_err());
        assert!(parse_bench("BENCH create\n", "create").is_err());
        assert!(parse_bench("BENCH create 1 x\n", "create").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_value(28074.9), "28075");
        assert_eq!(fmt_value(15.25), "15.25");
        assert_eq!(fmt_ratio(0.0123), "0.012x");
        assert_eq!(fmt_ratio(1.234), "1.23x");
    }
}
