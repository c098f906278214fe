//! The sandbox `activm run` puts itself in once its guests are set up (docs/security.md):
//! every thread installs the seccomp filter of its kind ([`seccomp`]) and the Landlock rules
//! that let it open only the files it was given ([`landlock`]). `--no-sandbox` turns both off;
//! library callers are not sandboxed unless they call [`configure`].

pub mod landlock;
pub mod seccomp;

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub use self::landlock::{Access, LandlockStatus};

/// What a thread does, which decides the system calls it may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread after setup: waits for the guests, joins, reports.
    Main,
    /// A vCPU: KVM_RUN, hypercalls, disk I/O, kicks.
    Vcpu,
    /// The dispatcher and the signal forwarder: rebalancing, kicks, MSIs.
    Dispatcher,
    /// The console writer: writes what the guests print.
    Io,
    /// A disk's I/O threads and completion timer (`devices::blk_async`): host file I/O,
    /// completions into guest memory, interrupts and kicks to the guest's vCPUs.
    Disk,
    /// The control socket: accepts clients, one thread per client (bounded).
    Control,
    /// A guest's net thread: waits for socket readiness, posts it, MSIs.
    Net,
}

impl ThreadKind {
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Dispatcher => "dispatcher",
            ThreadKind::Io => "io",
            ThreadKind::Disk => "disk",
            ThreadKind::Control => "control",
            ThreadKind::Net => "net",
        }
    }
}

/// Exit status of a process stopped by its seccomp filter: 128 + SIGSYS.
pub const EXIT_SECCOMP: i32 = 128 + libc::SIGSYS;

/// Debugging aid for the tests: with `ACTIVM_SANDBOX_PROBE=KIND` (a [`ThreadKind::name`]) the
/// first thread of that kind makes a forbidden system call right after its filter is in place;
/// with `ACTIVM_SANDBOX_PROBE=landlock` the main thread tries to open a file it was not given.
pub const PROBE_ENV: &str = "ACTIVM_SANDBOX_PROBE";

static ENABLED: AtomicBool = AtomicBool::new(false);
static PATHS: Mutex<Vec<(PathBuf, Access)>> = Mutex::new(Vec::new());
static PROBED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's kind, for the SIGSYS report.
    static KIND: Cell<Option<ThreadKind>> = const { Cell::new(None) };
}

/// Turn the sandbox on (the CLI, unless `--no-sandbox`) and install the SIGSYS reporter.
pub fn configure(enabled: bool) {
    ENABLED.store(enabled, Ordering::Release);
    if enabled {
        seccomp::install_sigsys_reporter();
    }
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// The files (and socket directories) the VMM may still use after setup.
pub fn allow_path(path: PathBuf, access: Access) {
    PATHS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((path, access));
}

/// The kind of the calling thread, if it entered the sandbox (or inherited it).
pub fn current_kind() -> Option<ThreadKind> {
    KIND.with(Cell::get)
}

/// Label a thread that inherited its creator's sandbox (a control client's thread).
pub fn inherit(kind: ThreadKind) {
    KIND.with(|k| k.set(Some(kind)));
}

/// Put the calling thread in the sandbox of `kind`: Landlock first (it needs system calls
/// the filters forbid), then the seccomp filter. A filter that cannot be installed stops
/// activm (status 1): running unconfined without being asked to is worse.
pub fn enter(kind: ThreadKind) {
    if !enabled() {
        return;
    }
    KIND.with(|k| k.set(Some(kind)));
    let paths = PATHS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let status = landlock::restrict(&paths);
    if kind == ThreadKind::Main {
        if let LandlockStatus::Unavailable(why) = &status {
            eprintln!("activm: warning: Landlock is not available ({why}); files are not confined");
        }
        if probe_is("landlock") {
            let me = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
            match std::fs::File::open(&me) {
                Ok(_) => eprintln!("activm: sandbox probe: opened {}", me.display()),
                Err(e) => eprintln!("activm: sandbox probe: open {}: {e}", me.display()),
            }
        }
    }
    if let Err(e) = seccomp::install(kind) {
        eprintln!(
            "activm: error: cannot install the seccomp filter of the {} thread: {e}",
            kind.name()
        );
        std::process::exit(1);
    }
    if probe_is(kind.name()) && !PROBED.swap(true, Ordering::AcqRel) {
        seccomp::make_forbidden_call();
    }
}

fn probe_is(name: &str) -> bool {
    std::env::var(PROBE_ENV).is_ok_and(|v| v == name)
}
