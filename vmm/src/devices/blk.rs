//! The block device behind the `blk_*` hypercalls (`protocol::blk`): a host file of whole
//! sectors, read and written with positioned I/O straight into guest memory.
//!
//! **Fast path, slow path.** A request that can complete without waiting does so inside the
//! exit, with the vCPU keeping its processor: a read the host page cache serves at once
//! (`preadv2` with `RWF_NOWAIT`), a buffered write. A request that would wait (a cold read, a
//! flush, any request of a device configured with `--io-latency`) is *blocking*: the vCPU
//! thread gives its processor back first and does the I/O while the guest gets BLOCKED /
//! UNBLOCKED upcalls (`vcpu.rs`).
//!
//! **Two-phase wait.** On a device with `--io-latency` the data of a read or write still moves
//! inside the exit when the page cache allows, and only the emulated latency is left: its end
//! is known then. If it ends within the disk's inline wait (`--io-inline-wait`, default
//! [`DEFAULT_INLINE_WAIT`](crate::config::DEFAULT_INLINE_WAIT)) the exit waits for it and
//! returns the result, as a spinning lock spins before it sleeps: cheaper than blocking
//! (BLOCKED, a new activation, UNBLOCKED; or, for the asynchronous path, a completion posted
//! later with a wake-up). Only a request that would wait longer (or whose data waits for the
//! host: a cold read, a flush) blocks.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use protocol::blk::{
    BLK_ERR_IO, BLK_ERR_RANGE, BLK_ERR_READ_ONLY, BLK_FLAG_ASYNC, BLK_FLAG_READ_ONLY,
    BLK_INFO_FLAGS, BLK_INFO_SECTORS, BLK_MAX_SECTORS, BLK_OK, SECTOR_SIZE,
};

use crate::config::{DiskConfig, MAX_INLINE_WAIT, MAX_LATENCY};
use crate::devices::blk_async::queue::AsyncQueue;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

pub mod request;

pub use request::{Op, Pending, Request};

/// Counters for `--stats`.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    /// Requests completed inside the exit (the vCPU kept its processor).
    pub immediate: AtomicU64,
    /// Of those, requests whose emulated latency was waited for in the exit (two-phase wait).
    pub waited_inline: AtomicU64,
    /// Requests that blocked the vCPU.
    pub blocking: AtomicU64,
    /// Asynchronous requests that went on after their exit (`blk_submit` → `BLK_IN_FLIGHT`).
    pub asynchronous: AtomicU64,
    /// Requests taken from the submission ring (no exit), and the times its consumer woke.
    pub ring_submitted: AtomicU64,
    pub consumer_wakeups: AtomicU64,
    /// Completions of asynchronous requests that went on after their exit, by who posted them
    /// (`blk_async/timer.rs`): a vCPU thread in an exit it made anyway (or starting a new
    /// activation), a halted vCPU's thread polling for them, the timer thread, an I/O thread
    /// (data that waited for the host); and the timer thread's wake-ups.
    pub posted_at_exits: AtomicU64,
    pub posted_by_poller: AtomicU64,
    pub posted_by_timer: AtomicU64,
    pub posted_by_io: AtomicU64,
    /// Submission-ring requests complete when taken (their latency over by then): posted at
    /// once by whoever took them.
    pub posted_when_taken: AtomicU64,
    pub timer_wakeups: AtomicU64,
    pub bytes: AtomicU64,
    /// Total time blocking requests took, in microseconds.
    pub blocked_us: AtomicU64,
}

/// A guest's block device.
#[derive(Debug)]
pub struct Disk {
    file: File,
    path: PathBuf,
    sectors: u64,
    read_only: bool,
    latency: Duration,
    inline_wait: Duration,
    pub stats: DiskStats,
    /// Asynchronous requests (`blk_submit`, `blk_async/`).
    pub queue: AsyncQueue,
}

impl Disk {
    /// Open the image and lock it against other writers (an exclusive lock when writable, a
    /// shared one when read-only).
    pub fn open(config: &DiskConfig) -> Result<Disk, Error> {
        let fail = |what: &str| Error::Config(format!("--disk {}: {what}", config.path.display()));
        if config.latency > MAX_LATENCY {
            return Err(Error::Config(format!(
                "--io-latency is at most {} us",
                MAX_LATENCY.as_micros()
            )));
        }
        if config.inline_wait > MAX_INLINE_WAIT {
            return Err(Error::Config(format!(
                "--io-inline-wait is at most {} us",
                MAX_INLINE_WAIT.as_micros()
            )));
        }
        let file = crate::hostfile::open_regular(&config.path, !config.read_only)
            .map_err(|e| fail(&e.to_string()))?;
        let meta = file.metadata().map_err(|e| fail(&e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a regular file"));
        }
        if meta.len() == 0 || meta.len() % SECTOR_SIZE != 0 {
            return Err(fail(&format!(
                "its size ({} bytes) is not a non-zero multiple of {SECTOR_SIZE} bytes",
                meta.len()
            )));
        }
        let lock = if config.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } != 0 {
            return Err(fail("in use by another process (it holds a lock on it)"));
        }
        Ok(Disk {
            file,
            path: config.path.clone(),
            sectors: meta.len() / SECTOR_SIZE,
            read_only: config.read_only,
            latency: config.latency,
            inline_wait: config.inline_wait,
            stats: DiskStats::default(),
            queue: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `blk_info(what)`.
    pub fn info(&self, what: u64) -> Option<u64> {
        match what {
            BLK_INFO_SECTORS => Some(self.sectors),
            BLK_INFO_FLAGS => Some(
                BLK_FLAG_ASYNC
                    | protocol::blk_submit::BLK_FLAG_SUBMIT_RING
                    | if self.read_only {
                        BLK_FLAG_READ_ONLY
                    } else {
                        0
                    },
            ),
            _ => None,
        }
    }

    /// Check a request against the protocol (`Err`: a violation, the guest is stopped) and the
    /// device (`Ok(Err(code))`: the guest gets `code`).
    pub fn check(&self, plan: &Plan, req: &Request) -> Result<Result<(), u64>, String> {
        if req.op != Op::Flush {
            if req.count == 0 || req.count > BLK_MAX_SECTORS {
                return Err(format!(
                    "count {} is not in 1..={BLK_MAX_SECTORS} sectors",
                    req.count
                ));
            }
            let len = req.count * SECTOR_SIZE;
            let inside = req.gpa >= plan.image.start
                && req
                    .gpa
                    .checked_add(len)
                    .is_some_and(|end| end <= plan.mem_size);
            if !inside {
                return Err(format!(
                    "buffer {:#x}+{len} is not in guest RAM at or above {:#x}",
                    req.gpa, plan.image.start
                ));
            }
            if req
                .sector
                .checked_add(req.count)
                .is_none_or(|end| end > self.sectors)
            {
                return Ok(Err(BLK_ERR_RANGE));
            }
            if req.op == Op::Write && self.read_only {
                return Ok(Err(BLK_ERR_READ_ONLY));
            }
        }
        Ok(Ok(()))
    }

    /// Whether `req` (checked) must block: flushes and any request of a slow device do.
    pub fn must_block(&self, req: &Request) -> bool {
        req.op == Op::Flush || !self.latency.is_zero()
    }

    /// The emulated latency (`--io-latency`).
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// Try to complete a checked request without waiting: `Some(result)` when done.
    pub fn try_now(&self, ram: &GuestRam, req: &Request) -> Option<u64> {
        if self.must_block(req) {
            return None;
        }
        let result = self.transfer_now(ram, req);
        if result.is_some() {
            self.stats.immediate.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Start a checked request inside its exit: `Ok(result)` when it completed (its data moved
    /// and its emulated latency, if any, ended within the inline wait, waited for here),
    /// else what is left to wait for.
    pub fn start(&self, ram: &GuestRam, req: &Request) -> Result<u64, Pending> {
        let (result, waited) = self.start_at(ram, req, Instant::now())?;
        self.count_immediate(waited);
        Ok(result)
    }

    /// [`Disk::start`] for a request made at `started` (not after now: the submission ring's
    /// requests are seen after they were made), the latency counted from then, without the
    /// counters: `Ok((result, whether the latency was waited for here))`.
    pub fn start_at(
        &self,
        ram: &GuestRam,
        req: &Request,
        started: Instant,
    ) -> Result<(u64, bool), Pending> {
        let Some(result) = self.transfer_now(ram, req) else {
            return Err(Pending::Data(*req));
        };
        let due = started + self.latency;
        if due.saturating_duration_since(Instant::now()) > self.inline_wait {
            return Err(Pending::Latency { result, due });
        }
        let waited = !self.latency.is_zero();
        // Spin: a sleep this short costs the host's timer slack (50 us by default).
        while waited && Instant::now() < due {
            std::hint::spin_loop();
        }
        Ok((result, waited))
    }

    /// Count a request completed inside its exit (`waited`: for its latency too).
    pub fn count_immediate(&self, waited: bool) {
        if waited {
            self.stats.waited_inline.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.immediate.fetch_add(1, Ordering::Relaxed);
    }

    /// Finish what [`Disk::start`] left, waiting as long as it takes (the emulated latency cut
    /// short if `stop` is set). Called with no processor held; counted as blocking.
    pub fn finish(&self, ram: &GuestRam, pending: &Pending, stop: &AtomicBool) -> u64 {
        match *pending {
            Pending::Data(req) => self.perform(ram, &req, stop),
            Pending::Latency { result, due } => {
                let started = Instant::now();
                sleep_until(due, &|| stop.load(Ordering::Acquire));
                self.stats.blocking.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .blocked_us
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                result
            }
        }
    }

    /// A request left with only its latency that blocked without a thread waiting for it
    /// (the UNBLOCKED goes out at `due`): counted as blocking, for the time left.
    pub fn count_blocked_until(&self, due: Instant) {
        self.stats.blocking.fetch_add(1, Ordering::Relaxed);
        self.stats.blocked_us.fetch_add(
            due.saturating_duration_since(Instant::now()).as_micros() as u64,
            Ordering::Relaxed,
        );
    }

    /// Try to move a read or write's data without waiting, whatever the emulated latency (the
    /// caller adds it): `Some(result)` when done. Flushes always wait.
    pub fn transfer_now(&self, ram: &GuestRam, req: &Request) -> Option<u64> {
        if req.op == Op::Flush {
            return None;
        }
        // Reads ask the page cache only. Buffered writes land in the page cache too, but few
        // filesystems take RWF_NOWAIT for them (ext4 refuses it): they are done here, in the
        // exit, and can stall only while the host throttles dirty pages.
        let flags = match req.op {
            Op::Read => libc::RWF_NOWAIT,
            _ => 0,
        };
        match self.transfer(ram, req, flags) {
            Ok(()) => {
                self.count(req);
                Some(BLK_OK)
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => None,
            // RWF_NOWAIT unsupported here (old kernel, some filesystems): take the slow path.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => None,
            Err(_) => Some(BLK_ERR_IO),
        }
    }

    /// Complete a checked request, waiting as long as it takes (plus the emulated latency,
    /// cut short if `stop` is set). Called with no processor held.
    pub fn perform(&self, ram: &GuestRam, req: &Request, stop: &AtomicBool) -> u64 {
        let started = Instant::now();
        let result = self.perform_until(ram, req, &|| stop.load(Ordering::Acquire));
        self.stats.blocking.fetch_add(1, Ordering::Relaxed);
        self.stats
            .blocked_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        result
    }

    /// [`Disk::perform`] without the blocking counters (for asynchronous requests), the
    /// emulated latency cut short once `stop()` says so.
    pub fn perform_until(&self, ram: &GuestRam, req: &Request, stop: &dyn Fn() -> bool) -> u64 {
        let started = Instant::now();
        let result = match req.op {
            Op::Flush => match self.file.sync_data() {
                Ok(()) => BLK_OK,
                Err(_) => BLK_ERR_IO,
            },
            Op::Read | Op::Write => match self.transfer(ram, req, 0) {
                Ok(()) => BLK_OK,
                Err(_) => BLK_ERR_IO,
            },
        };
        if req.op != Op::Flush {
            sleep_until(started + self.latency, stop);
        }
        self.count(req);
        result
    }

    fn count(&self, req: &Request) {
        let counter = match req.op {
            Op::Read => &self.stats.reads,
            Op::Write => &self.stats.writes,
            Op::Flush => &self.stats.flushes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if req.op != Op::Flush {
            self.stats
                .bytes
                .fetch_add(req.count * SECTOR_SIZE, Ordering::Relaxed);
        }
    }

    /// Positioned I/O between the file and guest memory, in full (short transfers are
    /// continued; `RWF_NOWAIT` stops at the first one that would wait).
    fn transfer(&self, ram: &GuestRam, req: &Request, flags: libc::c_int) -> std::io::Result<()> {
        let len = (req.count * SECTOR_SIZE) as usize;
        let mut done = 0usize;
        while done < len {
            let iov = libc::iovec {
                // `check` put the buffer inside guest RAM, which is mapped at `host_base` for
                // the guest's lifetime.
                iov_base: (ram.host_base() + req.gpa + done as u64) as *mut libc::c_void,
                iov_len: len - done,
            };
            let offset = (req.sector * SECTOR_SIZE + done as u64) as libc::off_t;
            let fd = self.file.as_raw_fd();
            let n = match req.op {
                // SAFETY: `iov` describes guest RAM inside the mapping (checked); the kernel
                // writes at most `iov_len` bytes there. Guest vCPUs may touch the same bytes
                // concurrently, as with DMA; no Rust reference to them exists.
                Op::Read => unsafe { libc::preadv2(fd, &iov, 1, offset, flags) },
                // SAFETY: as above; the kernel only reads the buffer.
                Op::Write => unsafe { libc::pwritev2(fd, &iov, 1, offset, flags) },
                Op::Flush => return Ok(()),
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// Sleep until `due`, or until `stop()` says so (looked at every millisecond).
fn sleep_until(due: Instant, stop: &dyn Fn() -> bool) {
    loop {
        let left = due.saturating_duration_since(Instant::now());
        if left.is_zero() || stop() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(1)));
    }
}

#[cfg(test)]
mod tests;
