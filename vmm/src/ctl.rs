//! The control socket: one JSON request per line on a Unix socket, one JSON answer per line
//! (in the manner of Firecracker's API). Requests:
//!
//! * `{"op":"list"}`: the budget and every guest with its vCPUs' states;
//! * `{"op":"set-pcpus","pcpus":N}`: change the budget of physical CPUs;
//! * `{"op":"set-vcpus","guest":G,"vcpus":N}`: cap how many vCPUs guest G may run at once.
//!
//! `activm ctl SOCKET ...` is the client.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::allocator::Slot;
use crate::error::Error;
use crate::guest::{Guest, Processors};

/// The longest request line; a longer one is answered with an error and the connection closed.
pub const MAX_LINE: usize = 64 * 1024;
/// Clients served at once; more are told so and closed.
pub const MAX_CLIENTS: usize = 8;
/// A client that sends nothing for this long is disconnected (it holds one of the slots).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `activm ctl` waits for the answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server; its socket file is removed when it is dropped (if it is still the one it made).
#[derive(Debug)]
pub struct CtlServer {
    path: PathBuf,
    identity: (u64, u64),
    _thread: JoinHandle<()>,
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        if identity(&self.path) == Some(self.identity) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Device and inode of what is at `path` (not following a symbolic link).
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Bind the control socket at `path`, mode 0600. Nothing but a stale socket (a socket file
/// that refuses connections) is ever replaced: a live socket, a regular file, a device, a
/// directory or a symbolic link there is an error. Returns the listener and the socket file's
/// identity.
pub fn bind(path: &Path) -> Result<Bound, Error> {
    let refuse = |why: String| Error::Config(format!("--ctl {}: {why}", path.display()));
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(e.to_string())),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(refuse(
                "something other than a socket is there; refusing to replace it".into(),
            ))
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => return Err(refuse("a running activm serves it".into())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                // A stale socket from an earlier run.
                std::fs::remove_file(path).map_err(|e| refuse(e.to_string()))?;
            }
            Err(e) => return Err(refuse(format!("an existing socket there: {e}"))),
        },
    }
    // SAFETY: umask only changes the process's file creation mask; restored right after.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|e| {
        Error::Host(format!(
            "cannot create the control socket {}: {e}",
            path.display()
        ))
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| refuse(e.to_string()))?;
    let id = identity(path).ok_or_else(|| refuse("vanished after bind".into()))?;
    Ok((listener, id))
}

/// The uid of the process at the other end of `stream` (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a ucred on this stack.
    let ok = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    } == 0;
    ok.then_some(cred.uid)
}

/// Only the user running activm, and root, may use the socket.
pub fn peer_allowed(peer: u32, me: u32) -> bool {
    peer == me || peer == 0
}

/// Counts the clients being served; a slot is given back when its guard is dropped.
#[derive(Debug, Default)]
pub struct ClientSlots(AtomicUsize);

/// One client's place among the [`MAX_CLIENTS`].
#[derive(Debug)]
pub struct ClientSlot(Arc<ClientSlots>);

impl ClientSlots {
    pub fn take(self: &Arc<Self>, max: usize) -> Option<ClientSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ClientSlot(Arc::clone(self)))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket from [`bind`], not served yet.
pub type Bound = (UnixListener, (u64, u64));

/// Serve the socket `bound` at `path` (bound before any guest started, so a refused path
/// stops activm before it runs anything).
pub fn serve(
    path: &Path,
    bound: Bound,
    guests: Vec<Arc<Guest>>,
    procs: Arc<Processors>,
) -> Result<CtlServer, Error> {
    let (listener, identity) = bound;
    let slots = Arc::new(ClientSlots::default());
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let thread = std::thread::Builder::new()
        .name("ctl".into())
        .spawn(move || {
            crate::sandbox::enter(crate::sandbox::ThreadKind::Control);
            for mut stream in listener.incoming().flatten() {
                if !peer_uid(&stream).is_some_and(|uid| peer_allowed(uid, me)) {
                    let _ = writeln!(
                        stream,
                        "{}",
                        json!({"ok": false, "error": "permission denied: another user"})
                    );
                    continue;
                }
                let Some(slot) = slots.take(MAX_CLIENTS) else {
                    let _ = writeln!(
                        stream,
                        "{}",
                        json!({"ok": false, "error": "too many clients"})
                    );
                    continue;
                };
                let guests = guests.clone();
                let procs = Arc::clone(&procs);
                // The slot goes with the connection's thread (or is dropped if it cannot start).
                let _ = std::thread::Builder::new()
                    .name("ctl-conn".into())
                    .spawn(move || {
                        let _slot = slot;
                        // Started by the sandboxed ctl thread: its filter and rules hold here.
                        crate::sandbox::inherit(crate::sandbox::ThreadKind::Control);
                        let _ = handle_connection(stream, &guests, &procs);
                    });
            }
        })
        .map_err(|e| Error::Host(format!("cannot start the control thread: {e}")))?;
    Ok(CtlServer {
        path: path.to_path_buf(),
        identity,
        _thread: thread,
    })
}

/// Read one line of at most `cap` bytes (without its newline); None at the end of the stream.
pub fn read_line_capped(reader: &mut impl BufRead, cap: usize) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let read = reader
        .by_ref()
        .take(cap as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("request line longer than {cap} bytes"),
        ));
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn handle_connection(
    stream: UnixStream,
    guests: &[Arc<Guest>],
    procs: &Processors,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    stream.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let line = match read_line_capped(&mut reader, MAX_LINE) {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                writeln!(writer, "{}", json!({"ok": false, "error": e.to_string()}))?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(request) => handle(&request, guests, procs),
            Err(e) => json!({"ok": false, "error": format!("not JSON: {e}")}),
        };
        writeln!(writer, "{answer}")?;
    }
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
/// handed over and granted ones are running. Returns the microseconds from `started` to the
/// change that settled it (not to when this thread ran again), or null.
fn wait_settled(procs: &Processors, started: std::time::Instant) -> Value {
    match procs.alloc.wait_settled(std::time::Duration::from_secs(1)) {
        Some(at) => json!(at.saturating_duration_since(started).as_secs_f64() * 1e6),
        None => Value::Null,
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
                    let (previous, kicks, granted) =
                        procs.alloc.set_concurrency_granting(guest.id, n as usize);
                    procs.revoke(kicks);
                    // An add is carried out when the vCPUs it granted run (later changes, the
                    // guest's own yields for one, are not its cost); a remove when settled.
                    let applied_us = if granted.is_empty() {
                        wait_settled(procs, started)
                    } else {
                        let timeout = std::time::Duration::from_secs(1);
                        match procs.alloc.wait_running(guest.id, &granted, timeout) {
                            Some(at) => {
                                json!(at.saturating_duration_since(started).as_secs_f64() * 1e6)
                            }
                            None => Value::Null,
                        }
                    };
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

/// The client side: send one request, return the answer line (within [`CLIENT_TIMEOUT`]).
pub fn request(socket: &Path, request: &Value) -> Result<Value, Error> {
    request_within(socket, request, CLIENT_TIMEOUT)
}

/// [`request`], waiting at most `timeout` for the answer.
pub fn request_within(socket: &Path, request: &Value, timeout: Duration) -> Result<Value, Error> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        Error::Host(format!(
            "cannot connect to {}: {e} (is activm running with --ctl?)",
            socket.display()
        ))
    })?;
    let io = |e: std::io::Error| Error::Host(format!("{}: {e}", socket.display()));
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut writer = stream.try_clone().map_err(io)?;
    writeln!(writer, "{request}").map_err(io)?;
    let line = read_line_capped(&mut BufReader::new(stream), MAX_LINE)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Host(format!(
                "{}: no answer within {} s",
                socket.display(),
                timeout.as_secs_f64()
            )),
            _ => io(e),
        })?
        .unwrap_or_default();
    serde_json::from_str(&line).map_err(|e| Error::Host(format!("bad answer from activm: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempPath;

    #[test]
    fn bind_replaces_only_a_stale_socket() {
        let dir = TempPath::dir("ctl-bind").unwrap();
        // A regular file is left alone.
        let file = dir.join("file");
        std::fs::write(&file, b"precious").unwrap();
        let e = bind(&file).unwrap_err().to_string();
        assert!(e.contains("refusing to replace it"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        // So are a directory and a device.
        assert!(bind(&dir).is_err());
        assert!(bind(Path::new("/dev/null")).is_err());
        assert!(Path::new("/dev/null").exists());
        // A live socket is in use.
        let sock = dir.join("sock");
        let (live, _) = bind(&sock).unwrap();
        let e = bind(&sock).unwrap_err().to_string();
        assert!(e.contains("a running activm serves it"), "{e}");
        // Once its listener is gone it is stale, and replaced.
        drop(live);
        let (_again, _) = bind(&sock).unwrap();
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn only_the_same_user_or_root_is_served() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(!peer_allowed(1001, 1000));
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(&a), Some(unsafe { libc::geteuid() }));
    }

    #[test]
    fn lines_are_capped() {
        let mut input = std::io::Cursor::new(b"short\n0123456789abc\nend".to_vec());
        assert_eq!(read_line_capped(&mut input, 10).unwrap().unwrap(), "short");
        let e = read_line_capped(&mut input, 10).unwrap_err();
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
        let mut input = std::io::Cursor::new(b"end".to_vec());
        assert_eq!(read_line_capped(&mut input, 10).unwrap().unwrap(), "end");
        assert_eq!(read_line_capped(&mut input, 10).unwrap(), None);
    }

    #[test]
    fn clients_are_bounded() {
        let slots = Arc::new(ClientSlots::default());
        let held: Vec<_> = (0..3).map(|_| slots.take(3).unwrap()).collect();
        assert!(slots.take(3).is_none());
        drop(held);
        assert!(slots.take(3).is_some());
    }

    #[test]
    fn the_client_gives_up_on_a_silent_server() {
        let dir = TempPath::dir("ctl-silent").unwrap();
        let sock = dir.join("sock");
        let (_listener, _) = bind(&sock).unwrap();
        let started = std::time::Instant::now();
        let e =
            request_within(&sock, &json!({"op": "list"}), Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("no answer within"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
