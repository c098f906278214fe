//! Hypercall decoding and the argument checks of every call, against guest RAM holding what
//! the fuzzer wrote: arbitrary load address, width, registers and memory. What needs a live VM
//! (KVM registers, the allocator's kicks) is left out; every check of a guest value is in.

#![no_main]

use std::sync::OnceLock;

use activm::config::DiskConfig;
use activm::devices::blk::{Disk, Request};
use activm::fuzzing::read_buffer;
use activm::hypercall::Call;
use activm_fuzz::{scratch_dir, Guest, Input, MEM_SIZE};
use libfuzzer_sys::fuzz_target;
use protocol::arch::x86_64::HYPERCALL_BASE;
use protocol::hypercall::MAX_WRITE_LEN;

const VCPUS: u32 = 4;

struct World {
    guest: Guest,
    disk: Disk,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let path = scratch_dir().join("hypercall-disk.img");
        std::fs::write(&path, vec![0u8; 64 * 512]).expect("disk image");
        let disk = Disk::open(&DiskConfig {
            path,
            read_only: false,
            latency: Default::default(),
            inline_wait: activm::config::DEFAULT_INLINE_WAIT,
        })
        .expect("disk");
        World {
            guest: Guest::new(VCPUS),
            disk,
        }
    })
}

fn blk(world: &World, req: Request) {
    let Ok(Ok(())) = world.disk.check(&world.guest.plan, &req) else {
        return;
    };
    if req.op != activm::devices::blk::Op::Flush {
        // What `check` accepts, the I/O touches through a raw pointer: it must lie in RAM.
        let end = req.gpa + req.count * 512;
        assert!(req.gpa >= world.guest.plan.image.start && end <= MEM_SIZE);
    }
    if world.disk.try_now(&world.guest.ram, &req).is_none() {
        let stop = std::sync::atomic::AtomicBool::new(false);
        world.disk.perform(&world.guest.ram, &req, &stop);
    }
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    let mut input = Input(data);
    // Guest memory: a few fuzzer-chosen bytes at fuzzer-chosen places.
    for _ in 0..input.u8() % 4 {
        let at = input.u32() as u64 % MEM_SIZE;
        let len = input.u8() as usize;
        let bytes: Vec<u8> = (0..len).map(|_| input.u8()).collect();
        let _ = world.guest.ram.write_bytes(at, &bytes);
    }
    let addr = match input.u8() % 4 {
        0 => input.u64(),
        _ => HYPERCALL_BASE + (input.u32() as u64 % 8192),
    };
    let len = match input.u8() % 8 {
        0 => input.u8() as usize,
        _ => 8,
    };
    let args = [
        input.number(),
        input.number(),
        input.number(),
        input.number(),
    ];
    let Ok((kind, call)) = Call::decode(addr, len, || args) else {
        return;
    };
    let plan = &world.guest.plan;
    match call {
        Call::ConsoleWrite { buf, len } | Call::Panic { buf, len } => {
            if let Ok(bytes) = read_buffer(&world.guest.ram, &world.guest.plan, kind, buf, len) {
                assert!(bytes.len() as u64 == len && len <= MAX_WRITE_LEN);
                // Never the VMM's supervisor pages below the image.
                let low = activm::arch::layout::USER_LOW;
                assert!(buf >= plan.image.start || (low.start <= buf && buf + len <= low.end));
            }
        }
        Call::Exit { code } => assert!((0..=255).contains(&code)),
        Call::SaRegister { entry } => {
            let _ = plan.image.contains(&entry);
        }
        Call::SaSetConcurrency { processors } => {
            let _ = processors == 0 || processors > VCPUS as u64;
        }
        Call::BlkInfo { what } => {
            let _ = world.disk.info(what);
        }
        Call::Blk(req) => blk(world, req),
        Call::FatalTrap
        | Call::VcpuStop
        | Call::Halt
        | Call::SaEnable
        | Call::TimelineSetup { .. }
        | Call::SaYield { .. }
        | Call::SaPreempt { .. } => {}
        // The asynchronous queue keeps its state in a live guest (`Arc<Guest>`, a VM): only
        // its decoding is fuzzed here; its requests' checks are `Disk::check`, as above.
        Call::BlkRingSetup { .. } | Call::BlkSubmit { .. } | Call::BlkDoorbell => {}
        // The submission ring's address check (its contents: the `blk` target).
        Call::BlkSubmitRingSetup { ring } => {
            if activm::devices::blk_async::check_ring_address(plan, ring).is_ok() {
                assert!(ring >= plan.image.start && ring.is_multiple_of(64));
            }
        }
        // Files and sockets act on host descriptors of a live guest: decoding only here (their
        // argument checks run in `devices/fs.rs` and `devices/net.rs` under the KVM tests).
        Call::Fs { .. } | Call::Net { .. } | Call::NetRingSetup { .. } => {}
    }
});
