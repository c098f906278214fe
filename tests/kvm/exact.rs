//! Checks that say exactly what ran: the rt-tests suite's list and count, the trace file's
//! structure, and whether KVM tests may be skipped at all.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libtest_mimic::Failed;

use super::{activm_run, guest, Run};

/// How a run of rt-tests is set up, which decides the tests it must skip.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The VMM's activations on (the default).
    pub activations: bool,
    pub vcpus: u32,
    pub disk: bool,
}

impl Setup {
    pub const fn new(activations: bool, vcpus: u32, disk: bool) -> Setup {
        Setup {
            activations,
            vcpus,
            disk,
        }
    }

    /// Whether rt-tests must skip `name` here (mirrors its `Needs`).
    fn skips(self, name: &str) -> bool {
        let needs_sim = name.starts_with("upcall-");
        let needs_activations =
            matches!(name, "sa-real" | "sa-chaos" | "idle-yield" | "refill-busy");
        let needs_disk = name.starts_with("blk");
        (needs_sim && self.activations)
            || (needs_activations && (!self.activations || self.vcpus < 2))
            || (needs_disk && !self.disk)
    }
}

/// Every test rt-tests has (`rt-tests list`), asked once.
fn all_rt_tests() -> Result<&'static [String], Failed> {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    if let Some(list) = LIST.get() {
        return Ok(list);
    }
    let run = activm_run(&guest("rt-tests")?, &[], &["list"])?.expect_code(0)?;
    let list: Vec<String> = run.stdout.lines().map(str::to_string).collect();
    if list.len() < 20 {
        return Err(format!("`rt-tests list` lists only {list:?}").into());
    }
    Ok(LIST.get_or_init(|| list))
}

/// The `test NAME ... RESULT` lines of a run (labelled `prefix`), by name; a name seen twice
/// is an error.
fn results<'a>(stdout: &'a str, prefix: &str) -> Result<BTreeMap<&'a str, &'a str>, Failed> {
    let mut seen = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line
            .strip_prefix(prefix)
            .and_then(|l| l.strip_prefix("test "))
        else {
            continue;
        };
        let Some((name, result)) = rest.split_once(" ... ") else {
            continue;
        };
        if seen.insert(name, result).is_some() {
            return Err(format!("test {name} reported twice\n{stdout}").into());
        }
    }
    Ok(seen)
}

/// rt-tests ran exactly `selected` (every test if empty) under `setup`: each one line, `ok`
/// unless the setup must skip it, nothing else, and the count line says so.
pub fn rt_suite_exact(
    run: Run,
    setup: Setup,
    selected: &[&str],
    prefix: &str,
) -> Result<Run, Failed> {
    let all = all_rt_tests()?;
    let wanted: Vec<&str> = if selected.is_empty() {
        all.iter().map(String::as_str).collect()
    } else {
        selected.to_vec()
    };
    let seen = results(&run.stdout, prefix)?;
    let mut problems = Vec::new();
    let mut passed = 0;
    for name in &wanted {
        let want_skip = setup.skips(name);
        match seen.get(name) {
            None => problems.push(format!("test {name} did not run")),
            Some(result) if want_skip && !result.starts_with("skipped (") => {
                problems.push(format!("test {name} should be skipped here: {result}"))
            }
            Some(result) if !want_skip && !result.starts_with("ok (") => {
                problems.push(format!("test {name}: {result}"))
            }
            Some(_) if !want_skip => passed += 1,
            Some(_) => {}
        }
    }
    for name in seen.keys() {
        if !wanted.contains(name) {
            problems.push(format!("test {name} ran but was not asked for"));
        }
    }
    let count = format!("{prefix}{passed} passed, 0 failed\n");
    if !run.stdout.contains(&count) {
        problems.push(format!("no count line {count:?}"));
    }
    if problems.is_empty() {
        Ok(run)
    } else {
        Err(format!(
            "{} ({setup:?})\n--- stdout\n{}--- stderr\n{}",
            problems.join("; "),
            run.stdout,
            run.stderr
        )
        .into())
    }
}

/// The trace file is Chrome trace-event JSON: a `traceEvents` array of objects with the
/// fields each phase needs, the guest named, `B`/`E` pairs matched per vCPU in time order, a
/// `running` span on each of `vcpus` vCPUs and at least one `console_write` instant.
pub fn check_trace(text: &str, guest_name: &str, vcpus: u64) -> Result<(), Failed> {
    use serde_json::Value;
    let root: Value =
        serde_json::from_str(text).map_err(|e| format!("the trace is not JSON: {e}"))?;
    let events = root
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("the trace has no traceEvents array")?;
    let mut open: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut last_ts: BTreeMap<u64, f64> = BTreeMap::new();
    let mut running = std::collections::BTreeSet::new();
    let (mut named, mut writes) = (false, 0);
    for (i, event) in events.iter().enumerate() {
        let field = |key: &str| event.get(key);
        let name = field("name").and_then(Value::as_str);
        let phase = field("ph").and_then(Value::as_str);
        let (Some(name), Some(phase)) = (name, phase) else {
            return Err(format!("event {i} lacks a name or phase: {event}").into());
        };
        if phase == "M" {
            named |= name == "process_name"
                && event.pointer("/args/name").and_then(Value::as_str) == Some(guest_name);
            continue;
        }
        let pid = field("pid").and_then(Value::as_u64);
        let tid = field("tid").and_then(Value::as_u64);
        let ts = field("ts").and_then(Value::as_f64);
        let (Some(0), Some(tid), Some(ts)) = (pid, tid, ts) else {
            return Err(format!("event {i} lacks pid 0, a tid or a ts: {event}").into());
        };
        if tid >= vcpus || ts < 0.0 {
            return Err(format!("event {i} has tid {tid} (of {vcpus} vCPUs) or ts {ts}").into());
        }
        if ts < last_ts.get(&tid).copied().unwrap_or(0.0) {
            return Err(format!("event {i} goes back in time on vCPU {tid}: {event}").into());
        }
        last_ts.insert(tid, ts);
        let stack = open.entry(tid).or_default();
        match phase {
            "B" => {
                running.extend((name == "running").then_some(tid));
                stack.push(name.to_string());
            }
            "E" => {
                if stack.pop().as_deref() != Some(name) {
                    return Err(format!(
                        "event {i} ends {name:?}, which is not open on vCPU {tid}"
                    )
                    .into());
                }
            }
            "i" => {
                if field("s").and_then(Value::as_str) != Some("t") {
                    return Err(format!("instant event {i} is not thread-scoped: {event}").into());
                }
                writes += usize::from(name == "console_write");
            }
            other => return Err(format!("event {i} has phase {other:?}: {event}").into()),
        }
    }
    if !named {
        return Err(format!("no process_name event names the guest {guest_name:?}").into());
    }
    if running.len() as u64 != vcpus {
        return Err(format!("`running` spans on vCPUs {running:?}, not on all {vcpus}").into());
    }
    if writes == 0 {
        return Err("no console_write instant".into());
    }
    Ok(())
}

/// Why KVM tests may not be skipped on this machine, if they may not: `/dev/kvm` exists (so a
/// failure to open it is a broken setup, not a machine without KVM), or the environment says
/// so (`ACTIVM_REQUIRE_KVM=1`, set by CI, which runs where KVM is).
pub fn kvm_required() -> Option<String> {
    match std::env::var("ACTIVM_REQUIRE_KVM") {
        Ok(v) if !v.is_empty() && v != "0" => {
            return Some("ACTIVM_REQUIRE_KVM is set".into());
        }
        _ => {}
    }
    std::path::Path::new("/dev/kvm")
        .exists()
        .then(|| "/dev/kvm exists".into())
}
