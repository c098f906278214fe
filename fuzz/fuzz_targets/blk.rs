//! Block-device requests as a guest sends them: a sequence of reads, writes and flushes with
//! arbitrary sector, buffer and count, against a disk of fuzzer-chosen size (read-only or
//! not). Checked against a model of the disk: what `check` accepts lies in guest RAM, the
//! result codes are the protocol's, and a read returns what was written. First, a submission
//! ring (`protocol::blk_submit`) at a fuzzer-chosen address with fuzzer-written bits and slots:
//! its address check, the taking of the bits and the decoding of each slot must never panic,
//! and every request they let through is one `check` would see from `blk_submit`.

#![no_main]

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use activm::config::DiskConfig;
use activm::devices::blk::{Disk, Op, Request};
use activm::devices::blk_async::{check_ring_address, parse_request, take_submissions};
use activm_fuzz::{scratch_dir, Guest, Input};
use libfuzzer_sys::fuzz_target;
use protocol::blk::{
    BLK_ERR_RANGE, BLK_ERR_READ_ONLY, BLK_INFO_SECTORS, BLK_MAX_SECTORS, BLK_OK, SECTOR_SIZE,
};

fuzz_target!(|data: &[u8]| {
    static GUEST: OnceLock<Guest> = OnceLock::new();
    let guest = GUEST.get_or_init(|| Guest::new(1));
    let plan = &guest.plan;
    let mut input = Input(data);
    let sectors = 1 + input.u8() as u64 % 64;
    let read_only = input.u8() % 4 == 0;
    let mut model: Vec<u8> = (0..sectors * SECTOR_SIZE).map(|i| i as u8).collect();
    let path = scratch_dir().join("blk-disk.img");
    std::fs::write(&path, &model).expect("disk image");
    let disk = Disk::open(&DiskConfig {
        path,
        read_only,
        latency: Default::default(),
        inline_wait: activm::config::DEFAULT_INLINE_WAIT,
    })
    .expect("disk");
    assert_eq!(disk.info(BLK_INFO_SECTORS), Some(sectors));
    submission_ring(guest, &disk, &mut input);
    let stop = AtomicBool::new(false);
    while !input.is_empty() {
        let op = match input.u8() % 3 {
            0 => Op::Read,
            1 => Op::Write,
            _ => Op::Flush,
        };
        let small = input.u8() % 4 != 0;
        let req = Request {
            op,
            sector: if small {
                input.u8() as u64 % 80
            } else {
                input.number()
            },
            gpa: if small {
                plan.heap.start + input.u32() as u64 % (plan.mem_size - plan.heap.start + 4096)
            } else {
                input.number()
            },
            count: if small {
                input.u8() as u64 % 300
            } else {
                input.number()
            },
        };
        let checked = match disk.check(plan, &req) {
            Err(_) => {
                assert!(op != Op::Flush);
                continue;
            }
            Ok(Err(code)) => {
                assert!(code == BLK_ERR_RANGE || code == BLK_ERR_READ_ONLY);
                continue;
            }
            Ok(Ok(())) => req,
        };
        if op == Op::Flush {
            let result = disk.perform(&guest.ram, &checked, &stop);
            assert_eq!(result, BLK_OK);
            continue;
        }
        let len = checked.count * SECTOR_SIZE;
        {
            assert!((1..=BLK_MAX_SECTORS).contains(&checked.count));
            assert!(checked.gpa >= plan.image.start && checked.gpa + len <= plan.mem_size);
            assert!(checked.sector + checked.count <= sectors);
            assert!(!(read_only && op == Op::Write));
        }
        if op == Op::Write {
            let fill = input.u8();
            guest
                .ram
                .write_bytes(checked.gpa, &vec![fill; len as usize])
                .unwrap();
        }
        let result = match disk.try_now(&guest.ram, &checked) {
            Some(result) => result,
            None => disk.perform(&guest.ram, &checked, &stop),
        };
        assert_eq!(result, BLK_OK, "{checked:?}");
        let range =
            (checked.sector * SECTOR_SIZE) as usize..(checked.sector * SECTOR_SIZE + len) as usize;
        match op {
            Op::Write => {
                model[range].copy_from_slice(&guest.ram.read_bytes(checked.gpa, len).unwrap())
            }
            Op::Read => assert!(guest.ram.read_bytes(checked.gpa, len).unwrap() == model[range]),
            Op::Flush => unreachable!(),
        }
    }
});

/// A submission ring the fuzzer placed and filled, taken and decoded as the consumer does.
fn submission_ring(guest: &Guest, disk: &Disk, input: &mut Input) {
    let plan = &guest.plan;
    let ring = if input.u8() % 4 != 0 {
        plan.heap.start + (input.u32() as u64 % (plan.mem_size - plan.heap.start + 4096) & !63)
    } else {
        input.number()
    };
    if check_ring_address(plan, ring).is_err() {
        return;
    }
    let bits = input.u64();
    guest.ram.write_u64(ring, bits).expect("checked ring");
    for _ in 0..input.u8() % 8 {
        let slot = ring + 128 + 32 * (input.u8() as u64 % 64);
        let words = [
            input.number(),
            input.number(),
            input.number(),
            input.number(),
        ];
        for (i, w) in words.iter().enumerate() {
            guest
                .ram
                .write_u64(slot + 8 * i as u64, *w)
                .expect("checked ring");
        }
    }
    let taken = take_submissions(&guest.ram, ring).expect("a checked ring is readable");
    assert_eq!(taken.len(), bits.count_ones() as usize);
    assert_eq!(guest.ram.read_u64(ring).unwrap(), 0, "the bits are taken");
    for taken in taken {
        let args = taken.args;
        assert!(bits & (1 << args[3]) != 0);
        let Ok((req, tag)) = parse_request(args) else {
            continue;
        };
        assert_eq!(tag, args[3]);
        if let Ok(Ok(())) = disk.check(plan, &req) {
            if req.op != Op::Flush {
                let len = req.count * SECTOR_SIZE;
                assert!((1..=BLK_MAX_SECTORS).contains(&req.count));
                assert!(req.gpa >= plan.image.start && req.gpa + len <= plan.mem_size);
            }
        }
    }
}
