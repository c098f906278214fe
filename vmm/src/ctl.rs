//! The control socket: one JSON request per line on a Unix socket, one JSON answer per line
//! (in the manner of Firecracker's API). Requests:
//!
//! * `{"op":"list"}`: the budget and every guest with its vCPUs' states;
//! * `{"op":"set-pcpus","pcpus":N}`: change the budget of physical CPUs;
//! * `{"op":"set-vcpus","guest":G,"vcpus":N}`: cap how many vCPUs guest G may run at once.
//!
//! `activm ctl SOCKET ...` is the client.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};

use crate::allocator::Slot;
use crate::error::Error;
use crate::guest::{Guest, Processors};

/// The server; the socket file is removed when it is dropped.
#[derive(Debug)]
pub struct CtlServer {
    path: PathBuf,
    _thread: JoinHandle<()>,
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn serve(
    path: &Path,
    guests: Vec<Arc<Guest>>,
    procs: Arc<Processors>,
) -> Result<CtlServer, Error> {
    if path.exists() {
        // A stale socket from an earlier run; a live one would still refuse the bind below.
        if UnixStream::connect(path).is_ok() {
            return Err(Error::Config(format!(
                "control socket {} is in use",
                path.display()
            )));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|e| {
        Error::Host(format!(
            "cannot create the control socket {}: {e}",
            path.display()
        ))
    })?;
    let thread = std::thread::Builder::new()
        .name("ctl".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let guests = guests.clone();
                let procs = Arc::clone(&procs);
                let _ = std::thread::Builder::new()
                    .name("ctl-conn".into())
                    .spawn(move || {
                        let _ = handle_connection(stream, &guests, &procs);
                    });
            }
        })
        .map_err(|e| Error::Host(format!("cannot start the control thread: {e}")))?;
    Ok(CtlServer {
        path: path.to_path_buf(),
        _thread: thread,
    })
}

fn handle_connection(
    stream: UnixStream,
    guests: &[Arc<Guest>],
    procs: &Processors,
) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(request) => handle(&request, guests, procs),
            Err(e) => json!({"ok": false, "error": format!("not JSON: {e}")}),
        };
        writeln!(writer, "{answer}")?;
    }
    Ok(())
}

fn slot_name(slot: &Slot) -> &'static str {
    match slot {
        Slot::Running(_) => "running",
        Slot::Revoking | Slot::HandOff => "revoking",
        Slot::Runnable(_) => "waiting",
        Slot::Parked => "parked",
        Slot::Blocked => "blocked",
        Slot::GrantedNew | Slot::GrantedResume => "starting",
        Slot::Stopped => "stopped",
    }
}

/// Wait (up to a second) until the allocator's decisions are carried out: revoked vCPUs have
/// handed over and granted ones are running. Returns the microseconds it took, or null.
fn wait_settled(procs: &Processors, started: std::time::Instant) -> Value {
    if procs.alloc.wait_settled(std::time::Duration::from_secs(1)) {
        json!(started.elapsed().as_secs_f64() * 1e6)
    } else {
        Value::Null
    }
}

/// Answer one request.
pub fn handle(request: &Value, guests: &[Arc<Guest>], procs: &Processors) -> Value {
    let number = |key: &str| request.get(key).and_then(Value::as_u64);
    match request.get("op").and_then(Value::as_str) {
        Some("list") => {
            let list: Vec<Value> = guests
                .iter()
                .map(|g| {
                    let view = procs.alloc.view(g.id);
                    json!({
                        "id": g.id,
                        "name": g.name,
                        "activations": view.activations,
                        "concurrency": view.concurrency,
                        "share": view.share,
                        "finished": g.outcome().is_some(),
                        "vcpus": view.vcpus.iter().map(slot_name).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({"ok": true, "pcpus": procs.alloc.budget(), "guests": list})
        }
        Some("set-pcpus") => match number("pcpus") {
            Some(n) if (1..=1024).contains(&n) => {
                let started = std::time::Instant::now();
                procs.revoke(procs.alloc.set_budget(n as usize));
                let applied_us = wait_settled(procs, started);
                json!({"ok": true, "pcpus": n, "applied_us": applied_us})
            }
            _ => {
                json!({"ok": false, "error": "set-pcpus needs \"pcpus\": a number from 1 to 1024"})
            }
        },
        Some("set-vcpus") => {
            let guest = number("guest").and_then(|g| guests.iter().find(|x| x.id as u64 == g));
            match (guest, number("vcpus")) {
                (Some(guest), Some(n)) if n >= 1 && n <= guest.config.vcpus as u64 => {
                    let started = std::time::Instant::now();
                    let (previous, kicks) = procs.alloc.set_concurrency(guest.id, n as usize);
                    procs.revoke(kicks);
                    let applied_us = wait_settled(procs, started);
                    json!({"ok": true, "guest": guest.id, "vcpus": n, "previous": previous, "applied_us": applied_us})
                }
                (None, _) => {
                    json!({"ok": false, "error": "set-vcpus needs \"guest\": the id of a guest (see list)"})
                }
                (Some(guest), _) => {
                    json!({"ok": false, "error": format!("set-vcpus needs \"vcpus\": 1 to {}", guest.config.vcpus)})
                }
            }
        }
        _ => json!({"ok": false, "error": "unknown op (list, set-pcpus, set-vcpus)"}),
    }
}

/// The client side: send one request, return the answer line.
pub fn request(socket: &Path, request: &Value) -> Result<Value, Error> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        Error::Host(format!(
            "cannot connect to {}: {e} (is activm running with --ctl?)",
            socket.display()
        ))
    })?;
    let mut writer = stream.try_clone().map_err(|e| Error::Host(e.to_string()))?;
    writeln!(writer, "{request}").map_err(|e| Error::Host(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| Error::Host(e.to_string()))?;
    serde_json::from_str(&line).map_err(|e| Error::Host(format!("bad answer from activm: {e}")))
}
