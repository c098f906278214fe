//! The runtime's std-shaped API held to std itself: the cases of rt-tests' `std_cases.rs` run
//! in a guest against activm-rt and here on the host against std, and every case's transcript
//! (outcomes only, no timings) must be the same, on 1 and 4 vCPUs with activations and on 2
//! without.

use std::collections::BTreeMap;
use std::sync::OnceLock as HostOnce;

use libtest_mimic::{Failed, Trial};

use super::{activm_run, guest};

/// What `std_cases` runs against here.
mod api {
    pub use std::format;
    pub use std::string::String;
    pub use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub use std::sync::{mpsc, Arc, Condvar, LazyLock, Mutex, Once, OnceLock};
    pub use std::sync::{PoisonError, RwLock, RwLockWriteGuard};
    pub use std::thread;
    pub use std::time::{Duration, Instant};
    pub use std::vec::Vec;
}

#[path = "../../guests/apps/rt-tests/src/std_cases.rs"]
mod std_cases;

/// Each case's transcript under std (run once).
fn host_transcripts() -> Result<&'static BTreeMap<&'static str, String>, Failed> {
    static DONE: HostOnce<BTreeMap<&'static str, String>> = HostOnce::new();
    if let Some(done) = DONE.get() {
        return Ok(done);
    }
    let mut all = BTreeMap::new();
    for &(name, case) in std_cases::CASES {
        let transcript = case().map_err(|why| format!("{name} fails under std: {why}"))?;
        all.insert(name, transcript);
    }
    Ok(DONE.get_or_init(|| all))
}

/// `test NAME ... ok (TRANSCRIPT; N ms)` lines of a run, by name.
fn guest_transcripts(stdout: &str) -> BTreeMap<&str, &str> {
    stdout
        .lines()
        .filter_map(|line| {
            let (name, result) = line.strip_prefix("test ")?.split_once(" ... ")?;
            let body = result.strip_prefix("ok (")?.strip_suffix(" ms)")?;
            Some((name, body.rsplit_once("; ")?.0))
        })
        .collect()
}

fn differential(options: &[&str]) -> Result<(), Failed> {
    let names: Vec<&str> = std_cases::CASES.iter().map(|&(name, _)| name).collect();
    let run = activm_run(&guest("rt-tests")?, options, &names)?;
    let want = host_transcripts()?;
    let got = guest_transcripts(&run.stdout);
    let mut problems = Vec::new();
    for (name, host) in want {
        match got.get(name) {
            Some(guest) if guest == host => {}
            Some(guest) => problems.push(format!("{name}:\n  std:   {host}\n  guest: {guest}")),
            None => problems.push(format!("{name}: no `ok` line")),
        }
    }
    if run.code != 0 {
        problems.push(format!("exit code {}", run.code));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{options:?}\n{}\n--- stdout\n{}--- stderr\n{}",
            problems.join("\n"),
            run.stdout,
            run.stderr
        )
        .into())
    }
}

pub fn tests() -> Vec<Trial> {
    vec![
        Trial::test("rt_std_api_matches_std_1_vcpu", || {
            differential(&["--vcpus", "1"])
        }),
        Trial::test("rt_std_api_matches_std_4_vcpus", || {
            differential(&["--vcpus", "4"])
        }),
        Trial::test("rt_std_api_matches_std_no_activations_2_vcpus", || {
            differential(&["--vcpus", "2", "--no-activations"])
        }),
    ]
}
