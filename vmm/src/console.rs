//! The guests' console output, kept off the vCPUs: a vCPU puts bytes into a bounded buffer and
//! returns; a writer thread of its own moves them to the real output (stdout). If nobody reads
//! that output, the writer blocks, the buffer fills and further bytes are dropped and counted:
//! a vCPU never blocks on it for longer than [`ROOM_WAIT`], so a timeout, a signal or the
//! guest's own exit still end the run.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bytes held for the writer at most.
pub const CAPACITY: usize = 1 << 20;
/// How long a write waits for room while the writer makes progress.
pub const ROOM_WAIT: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<u8>,
    /// Bytes the writer has taken and is writing now.
    in_flight: usize,
    /// Bytes written to the output so far (progress).
    written: u64,
    dropped: u64,
    /// A write found no room and no progress: drop at once until the writer moves again.
    stuck_at: Option<u64>,
}

/// The buffer between the vCPUs and the writer thread.
#[derive(Debug)]
pub struct ConsoleBuffer {
    state: Mutex<State>,
    changed: Condvar,
    capacity: usize,
}

impl ConsoleBuffer {
    /// A buffer of `capacity` bytes drained into `out` by a thread named `console`.
    pub fn spawn(out: Box<dyn Write + Send>, capacity: usize) -> std::io::Result<Arc<Self>> {
        let buffer = Arc::new(ConsoleBuffer {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            capacity,
        });
        let drained = Arc::clone(&buffer);
        std::thread::Builder::new()
            .name("console".into())
            .spawn(move || {
                // SIGINT/SIGTERM are for the forwarder, which may start after this thread
                // (SIGSYS must stay deliverable: the seccomp report).
                let _ = crate::signals::block();
                crate::sandbox::enter(crate::sandbox::ThreadKind::Io);
                drained.write_out(out)
            })?;
        Ok(buffer)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write_out(&self, mut out: Box<dyn Write + Send>) {
        loop {
            let chunk: Vec<u8> = {
                let mut state = self.lock();
                while state.queue.is_empty() {
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                let chunk: Vec<u8> = state.queue.drain(..).collect();
                state.in_flight = chunk.len();
                chunk
            };
            // The console is best effort: a closed output must not stop the guests.
            let _ = out.write_all(&chunk).and_then(|_| out.flush());
            let mut state = self.lock();
            state.written += chunk.len() as u64;
            state.in_flight = 0;
            state.stuck_at = None;
            self.changed.notify_all();
        }
    }

    /// Queue `bytes` for the output without blocking for long; what finds no room is dropped.
    pub fn put(&self, bytes: &[u8]) {
        let mut state = self.lock();
        let deadline = Instant::now() + ROOM_WAIT;
        while state.queue.len() + bytes.len() > self.capacity && state.stuck_at.is_none() {
            let now = Instant::now();
            if now >= deadline {
                state.stuck_at = Some(state.written);
                break;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let room = self.capacity.saturating_sub(state.queue.len());
        let taken = bytes.len().min(room);
        state.queue.extend(&bytes[..taken]);
        state.dropped += (bytes.len() - taken) as u64;
        self.changed.notify_all();
    }

    /// Bytes dropped because the output was not read.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Wait until everything queued is written, as long as the writer keeps making progress
    /// (`patience` without progress ends the wait). True if all was written.
    pub fn drain(&self, patience: Duration) -> bool {
        let mut state = self.lock();
        let mut seen = state.written;
        let mut since = Instant::now();
        while !state.queue.is_empty() || state.in_flight > 0 {
            if state.written != seen {
                seen = state.written;
                since = Instant::now();
            }
            let waited = since.elapsed();
            if waited >= patience {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, patience - waited)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// A `Write` for one guest's console.
    pub fn writer(self: &Arc<Self>) -> ConsoleWriter {
        ConsoleWriter(Arc::clone(self))
    }
}

/// One guest's end of a [`ConsoleBuffer`]: writes never fail and never block for long.
#[derive(Debug)]
pub struct ConsoleWriter(Arc<ConsoleBuffer>);

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.put(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that blocks every write until `open` is set, collecting what it gets.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, cv) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_blocked_output_never_blocks_the_writer_for_long() {
        let gate = Gate::default();
        let buffer = ConsoleBuffer::spawn(Box::new(gate.clone()), 16).unwrap();
        let mut w = buffer.writer();
        let started = Instant::now();
        for _ in 0..1000 {
            w.write_all(b"0123456789").unwrap();
        }
        // One wait for room at most, then drops at once.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(buffer.dropped() > 9000, "{}", buffer.dropped());
        assert!(!buffer.drain(Duration::from_millis(50)));
        // Once the output moves again, what was kept arrives in order.
        *gate.open.0.lock().unwrap() = true;
        gate.open.1.notify_all();
        assert!(buffer.drain(Duration::from_secs(5)));
        let got = gate.got.lock().unwrap().clone();
        assert!(!got.is_empty() && got.len() <= 16 + 10, "{}", got.len());
        assert!(got.starts_with(b"0123456789"));
        w.write_all(b"more").unwrap();
        assert!(buffer.drain(Duration::from_secs(5)));
        assert!(gate.got.lock().unwrap().ends_with(b"more"));
    }
}
