//! The block device behind the `blk_*` hypercalls (`protocol::blk`): a host file of whole
//! sectors, read and written with positioned I/O straight into guest memory.
//!
//! **Fast path, slow path.** A request that can complete without waiting does so inside the
//! exit, with the vCPU keeping its processor: a read the host page cache serves at once
//! (`preadv2` with `RWF_NOWAIT`), a buffered write. A request that would wait (a cold read, a
//! flush, any request of a device configured with `--io-latency`) is *blocking*: the vCPU
//! thread gives its processor back first and does the I/O while the guest gets BLOCKED /
//! UNBLOCKED upcalls (`vcpu.rs`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use protocol::blk::{
    BLK_ERR_IO, BLK_ERR_RANGE, BLK_ERR_READ_ONLY, BLK_FLAG_ASYNC, BLK_FLAG_READ_ONLY,
    BLK_INFO_FLAGS, BLK_INFO_SECTORS, BLK_MAX_SECTORS, BLK_OK, SECTOR_SIZE,
};

use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// How a guest's disk is set up (`activm run --disk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub read_only: bool,
    /// Added to every read and write (an emulated slow device); such requests always block.
    pub latency: Duration,
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
}

/// One checked request: `count` sectors from `sector`, to or from guest-physical `gpa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub sector: u64,
    pub gpa: u64,
    pub count: u64,
}

/// Counters for `--stats`.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    /// Requests completed inside the exit (the vCPU kept its processor).
    pub immediate: AtomicU64,
    /// Requests that blocked the vCPU.
    pub blocking: AtomicU64,
    /// Asynchronous requests that went on after their exit (`blk_submit` → `BLK_IN_FLIGHT`).
    pub asynchronous: AtomicU64,
    /// Requests taken from the submission ring (no exit), and the times its consumer woke.
    pub ring_submitted: AtomicU64,
    pub consumer_wakeups: AtomicU64,
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
    pub stats: DiskStats,
    /// Asynchronous requests (`blk_submit`, `blk_async.rs`).
    pub queue: crate::devices::blk_async::AsyncQueue,
}

/// Longest emulated latency accepted (a stuck guest must still be stoppable quickly).
pub const MAX_LATENCY: Duration = Duration::from_secs(10);

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
            while started.elapsed() < self.latency && !stop() {
                let left = self.latency.saturating_sub(started.elapsed());
                std::thread::sleep(left.min(Duration::from_millis(1)));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::StackSlots;
    use vmm_sys_util::tempfile::TempFile;

    fn temp() -> TempFile {
        TempFile::new_with_prefix("/tmp/activm-disk-test").unwrap()
    }

    fn disk_file(sectors: u64) -> TempFile {
        let file = temp();
        file.as_file().set_len(sectors * SECTOR_SIZE).unwrap();
        file
    }

    fn plan() -> Plan {
        let stacks = StackSlots::new(60 * 1024, Some(10), 64 << 20).unwrap();
        Plan::new(
            1,
            64 << 20,
            0x20_0000..0x30_0000,
            0x20_1000,
            16,
            0x20_0000,
            stacks,
        )
        .unwrap()
    }

    fn config(path: &Path, read_only: bool) -> DiskConfig {
        DiskConfig {
            path: path.into(),
            read_only,
            latency: Duration::ZERO,
        }
    }

    #[test]
    fn rejects_bad_images() {
        let empty = temp();
        assert!(Disk::open(&config(empty.as_path(), false)).is_err());
        let odd = temp();
        odd.as_file().set_len(1000).unwrap();
        let e = Disk::open(&config(odd.as_path(), false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of 512"), "{e}");
        assert!(Disk::open(&config(Path::new("/nonexistent/disk.img"), false)).is_err());
        assert!(Disk::open(&config(Path::new("/tmp"), true)).is_err());
    }

    #[test]
    fn a_writable_image_is_locked() {
        let file = disk_file(8);
        let _first = Disk::open(&config(file.as_path(), false)).unwrap();
        let e = Disk::open(&config(file.as_path(), false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("in use"), "{e}");
    }

    #[test]
    fn checks_requests() {
        let file = disk_file(8);
        let disk = Disk::open(&config(file.as_path(), true)).unwrap();
        let plan = plan();
        let req = |op, sector, gpa, count| Request {
            op,
            sector,
            gpa,
            count,
        };
        assert_eq!(
            disk.check(&plan, &req(Op::Read, 0, 0x40_0000, 8)),
            Ok(Ok(()))
        );
        assert_eq!(
            disk.check(&plan, &req(Op::Read, 1, 0x40_0000, 8)),
            Ok(Err(BLK_ERR_RANGE))
        );
        assert_eq!(
            disk.check(&plan, &req(Op::Read, u64::MAX, 0x40_0000, 2)),
            Ok(Err(BLK_ERR_RANGE))
        );
        assert_eq!(
            disk.check(&plan, &req(Op::Write, 0, 0x40_0000, 1)),
            Ok(Err(BLK_ERR_READ_ONLY))
        );
        assert!(
            disk.check(&plan, &req(Op::Read, 0, 0x1000, 1)).is_err(),
            "VMM memory"
        );
        assert!(
            disk.check(&plan, &req(Op::Read, 0, (64 << 20) - 256, 1))
                .is_err(),
            "past RAM"
        );
        assert!(
            disk.check(&plan, &req(Op::Read, 0, u64::MAX - 100, 1))
                .is_err(),
            "wraps"
        );
        assert!(disk.check(&plan, &req(Op::Read, 0, 0x40_0000, 0)).is_err());
        assert!(disk
            .check(&plan, &req(Op::Read, 0, 0x40_0000, 257))
            .is_err());
        assert_eq!(disk.info(BLK_INFO_SECTORS), Some(8));
        assert_eq!(
            disk.info(BLK_INFO_FLAGS),
            Some(BLK_FLAG_READ_ONLY | BLK_FLAG_ASYNC | protocol::blk_submit::BLK_FLAG_SUBMIT_RING)
        );
        assert_eq!(disk.info(7), None);
    }

    #[test]
    fn reads_and_writes_guest_memory() {
        let file = disk_file(4);
        std::fs::write(file.as_path(), [0xabu8; 2048]).unwrap();
        let disk = Disk::open(&config(file.as_path(), false)).unwrap();
        let ram = GuestRam::new(64 << 20).unwrap();
        let stop = AtomicBool::new(false);
        let read = Request {
            op: Op::Read,
            sector: 1,
            gpa: 0x40_0000,
            count: 2,
        };
        // Just written: in the page cache, so it completes without blocking.
        assert_eq!(disk.try_now(&ram, &read), Some(BLK_OK));
        assert_eq!(ram.read_bytes(0x40_0000, 1024).unwrap(), vec![0xab; 1024]);
        ram.write_bytes(0x50_0000, &[0x5a; 512]).unwrap();
        let write = Request {
            op: Op::Write,
            sector: 3,
            gpa: 0x50_0000,
            count: 1,
        };
        assert_eq!(disk.perform(&ram, &write, &stop), BLK_OK);
        let flush = Request {
            op: Op::Flush,
            sector: 0,
            gpa: 0,
            count: 0,
        };
        assert!(disk.must_block(&flush));
        assert_eq!(disk.perform(&ram, &flush, &stop), BLK_OK);
        let bytes = std::fs::read(file.as_path()).unwrap();
        assert_eq!(&bytes[1536..2048], &[0x5a; 512][..]);
        assert_eq!(disk.stats.reads.load(Ordering::Relaxed), 1);
        assert_eq!(disk.stats.writes.load(Ordering::Relaxed), 1);
        assert_eq!(disk.stats.flushes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn latency_blocks_and_stop_cuts_it_short() {
        let file = disk_file(4);
        let mut cfg = config(file.as_path(), false);
        cfg.latency = Duration::from_millis(20);
        let disk = Disk::open(&cfg).unwrap();
        let ram = GuestRam::new(64 << 20).unwrap();
        let read = Request {
            op: Op::Read,
            sector: 0,
            gpa: 0x40_0000,
            count: 1,
        };
        assert_eq!(
            disk.try_now(&ram, &read),
            None,
            "a slow device always blocks"
        );
        let t = Instant::now();
        assert_eq!(disk.perform(&ram, &read, &AtomicBool::new(false)), BLK_OK);
        assert!(t.elapsed() >= Duration::from_millis(20));
        let t = Instant::now();
        disk.perform(&ram, &read, &AtomicBool::new(true));
        assert!(t.elapsed() < Duration::from_millis(20));
        cfg.latency = Duration::from_secs(11);
        drop(disk);
        assert!(Disk::open(&cfg).is_err());
    }
}
