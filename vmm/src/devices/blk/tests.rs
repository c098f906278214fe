//! Unit tests of the block device (`blk.rs`).

use super::*;
use crate::config::DEFAULT_INLINE_WAIT;
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
        inline_wait: DEFAULT_INLINE_WAIT,
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

/// A read of sector 0 into guest address 4 MiB.
fn first_sector_read() -> Request {
    Request {
        op: Op::Read,
        sector: 0,
        gpa: 0x40_0000,
        count: 1,
    }
}

#[test]
fn latency_blocks_and_stop_cuts_it_short() {
    let file = disk_file(4);
    let mut cfg = config(file.as_path(), false);
    cfg.latency = Duration::from_millis(20);
    let disk = Disk::open(&cfg).unwrap();
    let ram = GuestRam::new(64 << 20).unwrap();
    let read = first_sector_read();
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

#[test]
fn a_short_latency_is_waited_for_in_the_exit() {
    let file = disk_file(4);
    let ram = GuestRam::new(64 << 20).unwrap();
    let read = first_sector_read();
    std::fs::write(file.as_path(), [7u8; 2048]).unwrap();
    let mut cfg = config(file.as_path(), false);
    cfg.latency = Duration::from_micros(20);
    let disk = Disk::open(&cfg).unwrap();
    let t = Instant::now();
    assert_eq!(disk.start(&ram, &read), Ok(BLK_OK));
    assert!(t.elapsed() >= Duration::from_micros(20));
    assert_eq!(disk.stats.waited_inline.load(Ordering::Relaxed), 1);
    let flush = Request {
        op: Op::Flush,
        ..read
    };
    assert_eq!(disk.start(&ram, &flush), Err(Pending::Data(flush)));
    drop(disk);
    // Longer than the inline wait: the data moved, only the latency is left to block on.
    cfg.latency = Duration::from_millis(20);
    cfg.inline_wait = Duration::from_micros(10);
    let disk = Disk::open(&cfg).unwrap();
    ram.write_bytes(0x40_0000, &[0; 512]).unwrap();
    let t = Instant::now();
    let Err(
        pending @ Pending::Latency {
            result: BLK_OK,
            due,
        },
    ) = disk.start(&ram, &read)
    else {
        panic!("a 20 ms device must block");
    };
    assert_eq!(ram.read_bytes(0x40_0000, 512).unwrap(), vec![7; 512]);
    assert!(due >= t + Duration::from_millis(20));
    assert_eq!(disk.finish(&ram, &pending, &AtomicBool::new(false)), BLK_OK);
    assert!(Instant::now() >= due);
    assert_eq!(disk.stats.blocking.load(Ordering::Relaxed), 1);
    cfg.inline_wait = Duration::from_millis(2);
    drop(disk);
    assert!(Disk::open(&cfg).is_err());
}
