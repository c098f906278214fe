//! Modes for the host's durability and fault tests: the guest does disk I/O while the host
//! kills activm or breaks the disk file under it, and prints what each request returned.

use alloc::vec;
use core::time::Duration;

use activm_rt::blk::{self, SECTOR_SIZE};
use activm_rt::{println, thread};

/// The byte `blk-durable` writes at `offset` of sector `sector` (the host test checks it).
pub fn durable_pattern(sector: u64, offset: usize) -> u8 {
    (sector as usize * 131 + offset * 7 + 1) as u8
}

/// `blk-durable SECTORS`: write SECTORS sectors from sector 0, flush, print `flushed SECTORS`,
/// then stay alive: the host kills activm right after that line.
pub fn durable(args: &[&str]) -> i32 {
    let sectors: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut buf = vec![0u8; (sectors * SECTOR_SIZE) as usize];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = durable_pattern(i as u64 / SECTOR_SIZE, i % SECTOR_SIZE as usize);
    }
    if let Err(e) = blk::write(0, &buf) {
        println!("write error: {e:?}");
        return 1;
    }
    if let Err(e) = blk::flush() {
        println!("flush error: {e:?}");
        return 1;
    }
    println!("flushed {sectors}");
    loop {
        thread::sleep(Duration::from_millis(100));
    }
}

/// `blk-fill`: write the disk 4 KiB at a time until the host fails a write (its filesystem is
/// full); print that error, then what a flush and a read of written data return. Exits 0 if a
/// write failed, 1 if the whole disk was written.
pub fn fill() -> i32 {
    let chunk = vec![0xa5u8; 4096];
    let step = chunk.len() as u64 / SECTOR_SIZE;
    let capacity = blk::capacity();
    let mut sector = 0;
    while sector + step <= capacity {
        if let Err(e) = blk::write(sector, &chunk) {
            println!("write error at sector {sector}: {e:?}");
            println!("flush after the error: {:?}", blk::flush());
            let mut back = vec![0u8; 4096];
            let read = blk::read(0, &mut back);
            let intact = back == chunk;
            println!("read after the error: {read:?}, data intact: {intact}");
            return 0;
        }
        sector += step;
    }
    println!("no write error in {capacity} sectors");
    1
}

/// `blk-vanish`: write and flush sector 0, print `ready`, then read it every 10 ms until the
/// host's truncation of the disk file makes the read fail (at most 30 s); print that error
/// and what a write then returns.
pub fn vanish() -> i32 {
    let mut buf = vec![0x5au8; SECTOR_SIZE as usize];
    if let Err(e) = blk::write(0, &buf).and_then(|()| blk::flush()) {
        println!("setup error: {e:?}");
        return 1;
    }
    println!("ready");
    for _ in 0..3000 {
        if let Err(e) = blk::read(0, &mut buf) {
            println!("read error after truncation: {e:?}");
            println!("write after truncation: {:?}", blk::write(0, &buf));
            return 0;
        }
        thread::sleep(Duration::from_millis(10));
    }
    println!("reads kept succeeding");
    1
}
