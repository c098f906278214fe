//! The runtime's timeline in `--trace` (`protocol::timeline`): under allocation chaos, guest
//! thread slices on several vCPUs, and a PREEMPTED context resumed on another vCPU than the one
//! it was taken from, as a flow arrow between two slices of the same thread.

use std::collections::BTreeMap;

use activm::testing::TempPath;
use libtest_mimic::Trial;
use serde_json::Value;

use super::{activm_run, guest};

/// Trace thread ids of the guest-thread tracks (`vmm/src/timeline.rs`).
const THREAD_TRACKS: u64 = 1000;

pub fn tests() -> Vec<Trial> {
    vec![Trial::test(
        "trace_shows_guest_threads_and_preempted_contexts_moving",
        || {
            let path = TempPath::new("timeline.json");
            let run = activm_run(
                &guest("rt-tests")?,
                &[
                    "--vcpus",
                    "4",
                    "--pcpus",
                    "2",
                    "--chaos",
                    "5",
                    "--trace",
                    path.to_str().ok_or("path")?,
                ],
                &["sa-chaos", "time-slicing"],
            )?
            .expect_code(0)?
            .stdout_has("2 passed, 0 failed")?;
            let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
            check_timeline(&text).map_err(|why| format!("{why}\n--- stdout\n{}", run.stdout).into())
        },
    )]
}

/// A guest-thread slice: track, start, end, thread id, why it ended.
struct Slice {
    tid: u64,
    start: f64,
    end: f64,
    thread: u64,
    left: String,
}

fn check_timeline(text: &str) -> Result<(), String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let events = root
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("no traceEvents array")?;
    let mut slices = Vec::new();
    let mut starts = BTreeMap::new();
    let mut finishes = BTreeMap::new();
    let (mut handled, mut summary, mut named) = (0, None, 0);
    for e in events {
        let ph = e["ph"].as_str().unwrap_or("");
        let tid = e["tid"].as_u64().unwrap_or(0);
        let ts = e["ts"].as_f64().unwrap_or(-1.0);
        match ph {
            "X" if e["cat"] == "thread" => {
                let dur = e["dur"].as_f64().ok_or(format!("slice without dur: {e}"))?;
                let thread = e["args"]["thread"].as_u64().unwrap_or(0);
                if tid < THREAD_TRACKS || ts < 0.0 || dur < 0.0 || thread == 0 {
                    return Err(format!("malformed thread slice {e}"));
                }
                slices.push(Slice {
                    tid,
                    start: ts,
                    end: ts + dur,
                    thread,
                    left: e["args"]["left"].as_str().unwrap_or("").to_string(),
                });
            }
            "s" => {
                starts.insert(e["id"].as_u64().unwrap_or(0), e.clone());
            }
            "f" => {
                finishes.insert(e["id"].as_u64().unwrap_or(0), e.clone());
            }
            "i" if e["name"] == "PREEMPTED handled" => handled += 1,
            "i" if e["name"] == "timeline" => summary = Some(e["args"].clone()),
            "M" if e["name"] == "thread_name"
                && e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(": threads")) =>
            {
                named += 1
            }
            _ => {}
        }
    }
    let tracks: std::collections::BTreeSet<u64> = slices.iter().map(|s| s.tid).collect();
    if tracks.len() < 2 {
        return Err(format!("thread slices on tracks {tracks:?} only"));
    }
    if named != 4 {
        return Err(format!("{named} guest-thread tracks named, not 4"));
    }
    if handled == 0 {
        return Err("no `PREEMPTED handled` instant".into());
    }
    let summary = summary.ok_or("no timeline summary (dropped events)")?;
    if summary["dropped"].as_u64().is_none() {
        return Err(format!("the summary has no drop count: {summary}"));
    }
    // A slice of thread T on the flow start's track ended by the VMM's preemption encloses
    // it, and a slice of T on another track encloses its finish.
    let within = |e: &Value, want_left: Option<&str>| {
        let (tid, ts) = (e["tid"].as_u64(), e["ts"].as_f64().unwrap_or(-1.0));
        slices
            .iter()
            .find(|s| {
                Some(s.tid) == tid
                    && s.start <= ts
                    && ts <= s.end
                    && want_left.is_none_or(|l| s.left == l)
            })
            .map(|s| s.thread)
    };
    let mut moved = 0;
    for (id, start) in &starts {
        let finish = finishes
            .get(id)
            .ok_or(format!("flow {id} starts but never finishes"))?;
        if start["name"] != "PREEMPTED resumed" || start["tid"] == finish["tid"] {
            continue;
        }
        let from = within(start, Some("preempted by the VMM"));
        let to = within(finish, None);
        if from.is_some() && from == to {
            moved += 1;
        }
    }
    if moved == 0 {
        return Err(format!(
            "no PREEMPTED context resumed on another vCPU ({} flows, {} slices)",
            starts.len(),
            slices.len()
        ));
    }
    Ok(())
}
