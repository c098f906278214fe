//! Cases that hold the runtime's std-shaped API to std's documented behaviour. The same source
//! is compiled twice: in rt-tests against `activm_rt` (the `api` module of the crate root) and
//! on the host against std (`tests/kvm/std_api.rs`), and each case's transcript must come out
//! the same in both. Transcripts therefore hold no timings, only outcomes; waits that must
//! happen are checked against generous bounds (the machine may be loaded).

use super::api::{format, mpsc, thread, Arc, Duration, Instant, String, Vec};
use super::api::{AtomicBool, AtomicUsize, Ordering};
use super::api::{Condvar, LazyLock, Mutex, Once, OnceLock, RwLock, RwLockWriteGuard};

/// A case: its transcript, or why it failed.
pub type Case = fn() -> Result<String, String>;

/// Every differential case, by rt-tests name.
pub static CASES: &[(&str, Case)] = &[
    ("std-rendezvous", rendezvous),
    ("std-receiver-drop", receiver_drop),
    ("std-channel-api", channel_api),
    ("std-once", once),
    ("std-instant", instant),
    ("std-scope", scope),
    ("std-park-timeout", park_timeout),
    ("std-condvar-timeout-while", condvar_timeout_while),
    ("std-rwlock-downgrade", rwlock_downgrade),
    ("std-error-display", error_display),
];

/// Long enough that a loaded machine never makes a wait that must not time out do so.
const PATIENCE: Duration = Duration::from_secs(20);

/// The case's transcript, if it is what std documents (and does: the host test runs the same
/// case against std and compares with the same constant).
fn expect(transcript: String, want: &str) -> Result<String, String> {
    if transcript == want {
        Ok(transcript)
    } else {
        Err(format!("got {transcript}; std gives {want}"))
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("expected {what}"))
    }
}

/// Retries `f` (sleeping a little between tries) until it returns `Some`, for at most
/// [`PATIENCE`].
fn retry<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > PATIENCE {
            return None;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

const WANT_RENDEZVOUS: &str = "try_send alone: Full true; send returned before recv: false; received Ok(7); send returned after: true; try_send to a waiting receiver: Some(true); it received Ok(5); send to a dropped receiver: Err(8)";

fn rendezvous() -> Result<String, String> {
    let mut out = Vec::new();
    // Nobody waits in `recv`: a rendezvous has no room.
    let (tx, rx) = mpsc::sync_channel::<u32>(0);
    let full = matches!(tx.try_send(1), Err(mpsc::TrySendError::Full(1)));
    out.push(format!("try_send alone: Full {full}"));
    // `send` returns only once the receiver took the message.
    let sent = Arc::new(AtomicBool::new(false));
    let h = {
        let sent = sent.clone();
        let tx = tx.clone();
        thread::spawn(move || {
            tx.send(7).expect("receiver alive");
            sent.store(true, Ordering::SeqCst);
        })
    };
    thread::sleep(Duration::from_millis(20));
    out.push(format!(
        "send returned before recv: {}",
        sent.load(Ordering::SeqCst)
    ));
    out.push(format!("received {:?}", rx.recv()));
    h.join().expect("join");
    out.push(format!(
        "send returned after: {}",
        sent.load(Ordering::SeqCst)
    ));
    // A receiver waiting in `recv` takes a `try_send`.
    let h = thread::spawn(move || rx.recv());
    let sent = retry(|| match tx.try_send(5) {
        Ok(()) => Some(true),
        Err(mpsc::TrySendError::Full(_)) => None,
        Err(mpsc::TrySendError::Disconnected(_)) => Some(false),
    });
    out.push(format!("try_send to a waiting receiver: {sent:?}"));
    out.push(format!("it received {:?}", h.join().expect("join")));
    // The receiver goes away while a sender waits: the message comes back.
    let (tx, rx) = mpsc::sync_channel::<u32>(0);
    let h = thread::spawn(move || tx.send(8).map_err(|e| e.0));
    thread::sleep(Duration::from_millis(10));
    drop(rx);
    out.push(format!(
        "send to a dropped receiver: {:?}",
        h.join().expect("join")
    ));
    expect(out.join("; "), WANT_RENDEZVOUS)
}

/// Counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const WANT_RECEIVER_DROP: &str =
    "reply: Err(Disconnected); send after: true; channel: 3 dropped; sync_channel(4): 3 dropped";

fn receiver_drop() -> Result<String, String> {
    let mut out = Vec::new();
    // A reply sender queued in a channel whose receiver is dropped disconnects at once.
    let (tx, rx) = mpsc::channel::<mpsc::Sender<u32>>();
    let (reply_tx, reply_rx) = mpsc::channel::<u32>();
    tx.send(reply_tx).expect("receiver alive");
    drop(rx);
    out.push(format!("reply: {:?}", reply_rx.recv_timeout(PATIENCE)));
    out.push(format!(
        "send after: {:?}",
        tx.send(reply_channel()).is_err()
    ));
    // Queued messages are dropped with the receiver, senders still alive.
    let drops = Arc::new(AtomicUsize::new(0));
    for bound in [None, Some(4)] {
        drops.store(0, Ordering::SeqCst);
        match bound {
            None => {
                let (tx, rx) = mpsc::channel();
                for _ in 0..3 {
                    tx.send(Counted(drops.clone())).map_err(|_| "send")?;
                }
                drop(rx);
                out.push(format!("channel: {} dropped", drops.load(Ordering::SeqCst)));
            }
            Some(n) => {
                let (tx, rx) = mpsc::sync_channel(n);
                for _ in 0..3 {
                    tx.send(Counted(drops.clone())).map_err(|_| "send")?;
                }
                drop(rx);
                out.push(format!(
                    "sync_channel({n}): {} dropped",
                    drops.load(Ordering::SeqCst)
                ));
            }
        }
    }
    expect(out.join("; "), WANT_RECEIVER_DROP)
}

fn reply_channel() -> mpsc::Sender<u32> {
    mpsc::channel().0
}

const WANT_CHANNEL_API: &str = "recv_timeout empty: Err(Timeout); recv_timeout, sent later: Ok(9); try_iter: [1, 2, 3]; try_iter empty: None; try_recv empty: Err(Empty); owned into_iter sum: 60; recv_timeout disconnected: Err(Disconnected); try_recv disconnected: Err(Disconnected); try_send room: true; try_send full: Full true; try_send disconnected: Disconnected true";

fn channel_api() -> Result<String, String> {
    let mut out = Vec::new();
    let (tx, rx) = mpsc::channel::<u32>();
    let start = Instant::now();
    let r = rx.recv_timeout(Duration::from_millis(30));
    out.push(format!("recv_timeout empty: {r:?}"));
    check(start.elapsed() >= Duration::from_millis(30), "a 30 ms wait")?;
    let h = {
        let tx = tx.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            tx.send(9)
        })
    };
    out.push(format!(
        "recv_timeout, sent later: {:?}",
        rx.recv_timeout(PATIENCE)
    ));
    h.join().expect("join").map_err(|_| "send")?;
    for v in 1..=3 {
        tx.send(v).map_err(|_| "send")?;
    }
    out.push(format!("try_iter: {:?}", rx.try_iter().collect::<Vec<_>>()));
    out.push(format!("try_iter empty: {:?}", rx.try_iter().next()));
    out.push(format!("try_recv empty: {:?}", rx.try_recv()));
    let h = {
        let tx = tx.clone();
        thread::spawn(move || (10..15).try_for_each(|v| tx.send(v)))
    };
    drop(tx);
    let sum: u32 = rx.into_iter().sum();
    out.push(format!("owned into_iter sum: {sum}"));
    h.join().expect("join").map_err(|_| "send")?;
    let (tx, rx) = mpsc::channel::<u32>();
    drop(tx);
    out.push(format!(
        "recv_timeout disconnected: {:?}",
        rx.recv_timeout(PATIENCE)
    ));
    out.push(format!("try_recv disconnected: {:?}", rx.try_recv()));
    let (tx, rx) = mpsc::sync_channel::<u32>(1);
    out.push(format!("try_send room: {:?}", tx.try_send(1).is_ok()));
    let full = matches!(tx.try_send(2), Err(mpsc::TrySendError::Full(2)));
    out.push(format!("try_send full: Full {full}"));
    drop(rx);
    let gone = matches!(tx.try_send(3), Err(mpsc::TrySendError::Disconnected(3)));
    out.push(format!("try_send disconnected: Disconnected {gone}"));
    expect(out.join("; "), WANT_CHANNEL_API)
}

static LAZY_RUNS: AtomicUsize = AtomicUsize::new(0);
static LAZY: LazyLock<u64> = LazyLock::new(|| {
    LAZY_RUNS.fetch_add(1, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(10));
    99
});

const WANT_ONCE: &str = "get before: None; OnceLock inits run: 1; seen: [42, 42, 42, 42, 42, 42, 42, 42]; wait: 42; set again: Err(7); set empty: Ok(()); take: Some(1) then None; LazyLock: [99, 99, 99, 99], runs 1; Once completed before: false; Once runs 1, callers saw [1, 1, 1, 1], completed true";

fn once() -> Result<String, String> {
    let mut out = Vec::new();
    let cell = Arc::new(OnceLock::<u64>::new());
    let runs = Arc::new(AtomicUsize::new(0));
    out.push(format!("get before: {:?}", cell.get()));
    let waiter = {
        let cell = cell.clone();
        thread::spawn(move || *cell.wait())
    };
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (cell, runs) = (cell.clone(), runs.clone());
            thread::spawn(move || {
                *cell.get_or_init(|| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Slow, so that others come while it runs and must wait.
                    thread::sleep(Duration::from_millis(20));
                    42
                })
            })
        })
        .collect();
    let seen: Vec<u64> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    out.push(format!(
        "OnceLock inits run: {}",
        runs.load(Ordering::SeqCst)
    ));
    out.push(format!("seen: {seen:?}"));
    out.push(format!("wait: {}", waiter.join().expect("join")));
    out.push(format!("set again: {:?}", cell.set(7)));
    let mut owned = OnceLock::new();
    out.push(format!("set empty: {:?}", owned.set(1u32)));
    out.push(format!("take: {:?} then {:?}", owned.take(), owned.get()));
    let handles: Vec<_> = (0..4).map(|_| thread::spawn(|| *LAZY)).collect();
    let seen: Vec<u64> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    out.push(format!(
        "LazyLock: {seen:?}, runs {}",
        LAZY_RUNS.load(Ordering::SeqCst)
    ));
    let once = Arc::new(Once::new());
    let runs = Arc::new(AtomicUsize::new(0));
    out.push(format!("Once completed before: {}", once.is_completed()));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (once, runs) = (once.clone(), runs.clone());
            thread::spawn(move || {
                once.call_once(|| {
                    thread::sleep(Duration::from_millis(10));
                    runs.fetch_add(1, Ordering::SeqCst);
                });
                // Every caller returns only after the one run finished.
                runs.load(Ordering::SeqCst)
            })
        })
        .collect();
    let seen: Vec<usize> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    out.push(format!(
        "Once runs {}, callers saw {seen:?}, completed {}",
        runs.load(Ordering::SeqCst),
        once.is_completed()
    ));
    expect(out.join("; "), WANT_ONCE)
}

const WANT_INSTANT: &str = "elapsed >= 10 ms: true; later > earlier: true; duration_since >= 10 ms: true; checked_duration_since(later): None; saturating_duration_since(later): 0ns; earlier - later: 0ns; (t + 1.5 s) - t: 1.5s; (t + 1.5 s) - 1.5 s == t: true; += -= round trip: true; checked_add(MAX): None; checked_sub(MAX): None; checked_add(1 s) is later: true";

fn instant() -> Result<String, String> {
    let mut out = Vec::new();
    let earlier = Instant::now();
    thread::sleep(Duration::from_millis(10));
    let later = Instant::now();
    out.push(format!(
        "elapsed >= 10 ms: {}",
        earlier.elapsed() >= Duration::from_millis(10)
    ));
    out.push(format!("later > earlier: {}", later > earlier));
    out.push(format!(
        "duration_since >= 10 ms: {}",
        later.duration_since(earlier) >= Duration::from_millis(10)
    ));
    out.push(format!(
        "checked_duration_since(later): {:?}",
        earlier.checked_duration_since(later)
    ));
    out.push(format!(
        "saturating_duration_since(later): {:?}",
        earlier.saturating_duration_since(later)
    ));
    out.push(format!("earlier - later: {:?}", earlier - later));
    let d = Duration::from_millis(1500);
    out.push(format!("(t + 1.5 s) - t: {:?}", (earlier + d) - earlier));
    out.push(format!(
        "(t + 1.5 s) - 1.5 s == t: {}",
        earlier + d - d == earlier
    ));
    let mut t = earlier;
    t += d;
    t -= d;
    out.push(format!("+= -= round trip: {}", t == earlier));
    out.push(format!(
        "checked_add(MAX): {:?}",
        earlier.checked_add(Duration::MAX)
    ));
    out.push(format!(
        "checked_sub(MAX): {:?}",
        earlier.checked_sub(Duration::MAX)
    ));
    out.push(format!(
        "checked_add(1 s) is later: {}",
        earlier.checked_add(Duration::from_secs(1)) > Some(earlier)
    ));
    expect(out.join("; "), WANT_INSTANT)
}

const WANT_SCOPE: &str =
    r#"sum 5050; named: Some("scoped-1"); unjoined finished: 14; mutable borrow: 7"#;

fn scope() -> Result<String, String> {
    let mut out = Vec::new();
    let numbers: Vec<u64> = (1..=100).collect();
    let finished = AtomicUsize::new(0);
    let mut local = 0u64;
    let total = thread::scope(|s| {
        let handles: Vec<_> = numbers
            .chunks(25)
            .map(|chunk| s.spawn(move || chunk.iter().sum::<u64>()))
            .collect();
        // Not joined: the scope waits for these itself.
        for _ in 0..4 {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(5));
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        // A scoped thread spawning another in the same scope.
        s.spawn(|| {
            s.spawn(|| finished.fetch_add(10, Ordering::SeqCst));
        });
        // A mutable borrow, given back when the scope ends.
        s.spawn(|| local = 7);
        let named = thread::Builder::new()
            .name("scoped-1".into())
            .spawn_scoped(s, || thread::current().name().map(String::from))
            .expect("spawn_scoped");
        let name = named.join().expect("join");
        (
            handles
                .into_iter()
                .map(|h| h.join().expect("join"))
                .sum::<u64>(),
            name,
        )
    });
    out.push(format!("sum {}", total.0));
    out.push(format!("named: {:?}", total.1));
    out.push(format!(
        "unjoined finished: {}",
        finished.load(Ordering::SeqCst)
    ));
    out.push(format!("mutable borrow: {local}"));
    expect(out.join("; "), WANT_SCOPE)
}

const WANT_PARK_TIMEOUT: &str =
    "alone: returned after the timeout; with a token: early true; unparked: early true";

fn park_timeout() -> Result<String, String> {
    let mut out = Vec::new();
    // No token: waits (at least) the timeout. std may return spuriously; retry as std's docs
    // advise, until the time has passed.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(20) {
        thread::park_timeout(Duration::from_millis(20).saturating_sub(start.elapsed()));
    }
    out.push("alone: returned after the timeout".into());
    // A token already there: returns at once (and consumes it).
    thread::current().unpark();
    let start = Instant::now();
    thread::park_timeout(PATIENCE);
    out.push(format!(
        "with a token: early {}",
        start.elapsed() < PATIENCE
    ));
    // Unparked by another thread while parked.
    let me = thread::current();
    let flag = Arc::new(AtomicBool::new(false));
    let h = {
        let flag = flag.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            flag.store(true, Ordering::SeqCst);
            me.unpark();
        })
    };
    let start = Instant::now();
    while !flag.load(Ordering::SeqCst) && start.elapsed() < PATIENCE {
        thread::park_timeout(PATIENCE);
    }
    out.push(format!("unparked: early {}", start.elapsed() < PATIENCE));
    h.join().expect("join");
    expect(out.join("; "), WANT_PARK_TIMEOUT)
}

const WANT_CONDVAR_TIMEOUT_WHILE: &str = "nobody: timed out true, value false; notified: timed out false, value true; already: timed out false";

fn condvar_timeout_while() -> Result<String, String> {
    let mut out = Vec::new();
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let (lock, cvar) = &*pair;
    let start = Instant::now();
    let (guard, result) = cvar
        .wait_timeout_while(
            lock.lock().expect("lock"),
            Duration::from_millis(30),
            |ready| !*ready,
        )
        .expect("lock");
    check(start.elapsed() >= Duration::from_millis(30), "a 30 ms wait")?;
    out.push(format!(
        "nobody: timed out {}, value {}",
        result.timed_out(),
        *guard
    ));
    drop(guard);
    let h = {
        let pair = pair.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            *pair.0.lock().expect("lock") = true;
            pair.1.notify_all();
        })
    };
    let (guard, result) = cvar
        .wait_timeout_while(lock.lock().expect("lock"), PATIENCE, |ready| !*ready)
        .expect("lock");
    out.push(format!(
        "notified: timed out {}, value {}",
        result.timed_out(),
        *guard
    ));
    drop(guard);
    h.join().expect("join");
    // The condition already false: no wait at all.
    let (guard, result) = cvar
        .wait_timeout_while(lock.lock().expect("lock"), Duration::ZERO, |ready| !*ready)
        .expect("lock");
    drop(guard);
    out.push(format!("already: timed out {}", result.timed_out()));
    expect(out.join("; "), WANT_CONDVAR_TIMEOUT_WHILE)
}

const WANT_RWLOCK_DOWNGRADE: &str =
    "downgraded reads 5; try_write while read: true; another reader: 5; write after: true";

fn rwlock_downgrade() -> Result<String, String> {
    let mut out = Vec::new();
    let lock = Arc::new(RwLock::new(0u32));
    let mut w = lock.write().expect("write");
    *w = 5;
    let r = RwLockWriteGuard::downgrade(w);
    out.push(format!("downgraded reads {}", *r));
    out.push(format!(
        "try_write while read: {}",
        lock.try_write().is_err()
    ));
    let other = {
        let lock = lock.clone();
        thread::spawn(move || *lock.read().expect("read"))
    };
    out.push(format!("another reader: {}", other.join().expect("join")));
    drop(r);
    out.push(format!("write after: {}", lock.try_write().is_ok()));
    expect(out.join("; "), WANT_RWLOCK_DOWNGRADE)
}

const WANT_ERROR_DISPLAY: &str = r#"sending on a closed channel | receiving on a closed channel | receiving on an empty channel | receiving on a closed channel | timed out waiting on channel | channel is empty and sending half is closed | sending on a full channel | sending on a closed channel | TrySendError::Full(..) | SendError { .. } | poisoned lock: another task failed inside | try_lock failed because the operation would block / "WouldBlock""#;

fn error_display() -> Result<String, String> {
    fn show<E: core::error::Error>(e: E) -> String {
        format!("{e}")
    }
    let m = Mutex::new(0);
    let held = m.lock().expect("lock");
    let would_block = match m.try_lock() {
        Err(e) => format!("{e} / {e:?}"),
        Ok(_) => "locked twice".into(),
    };
    drop(held);
    let out = [
        show(mpsc::SendError(1)),
        show(mpsc::RecvError),
        show(mpsc::TryRecvError::Empty),
        show(mpsc::TryRecvError::Disconnected),
        show(mpsc::RecvTimeoutError::Timeout),
        show(mpsc::RecvTimeoutError::Disconnected),
        show(mpsc::TrySendError::Full(1)),
        show(mpsc::TrySendError::Disconnected(1)),
        format!("{:?}", mpsc::TrySendError::Full(1)),
        format!("{:?}", mpsc::SendError(1)),
        show(super::api::PoisonError::new(1)),
        would_block,
    ];
    expect(out.join(" | "), WANT_ERROR_DISPLAY)
}
