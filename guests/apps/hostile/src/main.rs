//! A hostile guest: one protocol violation or abuse per mode (the first guest argument), for
//! the VMM's hostile-guest tests (`tests/kvm/hostile.rs`). It bypasses the runtime and talks to
//! the VMM with raw hypercalls and raw shared-area writes.
//!
//! A mode the VMM must refuse with a code the guest sees prints `hostile MODE: refused (...)` and
//! exits 0 when the code is the documented one (1 otherwise). A mode the VMM must stop never
//! gets past its hypercall: if it does, the guest says so and exits 1. vCPUs other than 0 stop
//! at once unless the mode uses them.
#![no_std]
#![no_main]

extern crate alloc;

mod blk_ring;
mod sa;

#[cfg(target_arch = "aarch64")]
use activm_stub::protocol::arch::aarch64::HYPERCALL_BASE;
#[cfg(target_arch = "x86_64")]
use activm_stub::protocol::arch::x86_64::HYPERCALL_BASE;
use activm_stub::protocol::blk::{BLK_ERR_RANGE, BLK_OK};
use activm_stub::protocol::hypercall::{Hypercall, HC_UNSUPPORTED, MAX_WRITE_LEN};
use activm_stub::{args, boot_info, exit, hypercall, println, vcpu_stop};

/// Every mode, in the order the tests list them.
pub const MODES: &[&str] = &[
    "console-outside-ram",
    "console-past-ram-end",
    "console-wraps",
    "console-too-long",
    "console-vmm-pages",
    "panic-bad-buffer",
    "blk-vmm-pages",
    "blk-wraps",
    "blk-past-ram-end",
    "blk-count-zero",
    "blk-count-huge",
    "blk-sector-huge",
    "blk-info-unknown",
    "blk-ring-garbage",
    "blk-ring-without-completions",
    "unknown-hypercall",
    "hypercall-gap",
    "misaligned-hypercall",
    "narrow-hypercall",
    "store-hypercall",
    "byte-store-hypercall",
    "unbacked-load",
    #[cfg(target_arch = "x86_64")]
    "port-io",
    #[cfg(target_arch = "aarch64")]
    "el1-register",
    "all-vcpus-stop",
    "stack-overflow",
    "hypercall-flood",
    "sa-register-outside-image",
    "sa-enable-unregistered",
    "sa-before-enable",
    "concurrency-zero",
    "concurrency-max",
    "preempt-nonexistent",
    "queue-indices-huge",
    "never-consumes",
    "consumes-late",
    "entry-garbage",
    "stack-unaligned",
    "stack-outside-ram",
    "stack-in-vmm-pages",
    "stack-pool-exhausted",
    "stack-indices-corrupt",
    "corrupt-records",
];

fn main(vcpu: u32) -> ! {
    let mode = args().next().unwrap_or("");
    if let Some(run) = sa::mode(mode) {
        run(vcpu)
    }
    match mode {
        "all-vcpus-stop" => vcpu_stop(),
        "hypercall-flood" => flood(vcpu),
        _ if vcpu != 0 => vcpu_stop(),
        _ if blk_ring::mode(mode).is_some() => blk_ring::mode(mode).expect("checked")(mode),
        "console-outside-ram" => {
            stopped(mode, raw(Hypercall::ConsoleWrite, 0x7fff_0000_0000, 16, 0))
        }
        "console-past-ram-end" => {
            stopped(mode, raw(Hypercall::ConsoleWrite, mem_size() - 8, 16, 0))
        }
        "console-wraps" => stopped(mode, raw(Hypercall::ConsoleWrite, u64::MAX - 7, 16, 0)),
        "console-too-long" => {
            let heap = boot_info().heap_start;
            stopped(
                mode,
                raw(Hypercall::ConsoleWrite, heap, MAX_WRITE_LEN + 1, 0),
            )
        }
        // The GDT: RAM, but the VMM's and supervisor-only.
        "console-vmm-pages" => stopped(mode, raw(Hypercall::ConsoleWrite, 0x1000, 64, 0)),
        "panic-bad-buffer" => stopped(mode, raw(Hypercall::Panic, u64::MAX - 7, 16, 0)),
        // The page tables.
        "blk-vmm-pages" => stopped(mode, blk(Hypercall::BlkRead, 0, 0x8000, 1)),
        "blk-wraps" => stopped(mode, blk(Hypercall::BlkRead, 0, u64::MAX - 255, 1)),
        "blk-past-ram-end" => stopped(mode, blk(Hypercall::BlkWrite, 0, mem_size() - 256, 1)),
        "blk-count-zero" => stopped(mode, blk(Hypercall::BlkRead, 0, heap(), 0)),
        "blk-count-huge" => stopped(mode, blk(Hypercall::BlkRead, 0, heap(), 257)),
        "blk-sector-huge" => {
            let read = blk(Hypercall::BlkRead, u64::MAX - 1, heap(), 2);
            let write = blk(Hypercall::BlkWrite, u64::MAX, heap(), 1);
            let fine = blk(Hypercall::BlkRead, 0, heap(), 1);
            refused(
                mode,
                read == BLK_ERR_RANGE && write == BLK_ERR_RANGE && fine == BLK_OK,
                format_args!("read {read}, write {write}, then a good read {fine}"),
            )
        }
        "blk-info-unknown" => {
            let got = raw(Hypercall::BlkInfo, 99, 0, 0);
            refused(
                mode,
                got == HC_UNSUPPORTED,
                format_args!("blk_info(99) = {got:#x}"),
            )
        }
        "unknown-hypercall" => stopped(mode, raw_nr(511, 0, 0, 0)),
        "hypercall-gap" => stopped(mode, raw_nr(7, 0, 0, 0)),
        "misaligned-hypercall" => stopped(mode, load(HYPERCALL_BASE + 8 * 2 + 4)),
        "narrow-hypercall" => {
            let addr = Hypercall::BlkInfo.address(HYPERCALL_BASE);
            // SAFETY: a 4-byte load from the hypercall page: the VMM must stop the guest.
            stopped(mode, u64::from(unsafe { arch::load32(addr) }))
        }
        "store-hypercall" => {
            // SAFETY: an 8-byte store to the hypercall page: the VMM must stop the guest.
            unsafe { arch::store64(Hypercall::Exit.address(HYPERCALL_BASE), 0) };
            stopped(mode, 0)
        }
        "byte-store-hypercall" => {
            // SAFETY: a 1-byte store into an unused slot of the hypercall page: stopped.
            unsafe { arch::store8(HYPERCALL_BASE + 8 * 300 + 3, 0x41) };
            stopped(mode, 0)
        }
        // Past the hypercall page, inside its 2 MiB mapping: nothing there.
        "unbacked-load" => stopped(mode, load(HYPERCALL_BASE + 0x1000)),
        #[cfg(target_arch = "x86_64")]
        "port-io" => {
            // SAFETY: port I/O at CPL3 with IOPL 0 raises #GP: a fatal trap.
            unsafe { core::arch::asm!("out 0x80, al", in("al") 0u8, options(nomem, nostack)) };
            stopped(mode, 0)
        }
        // aarch64 has no port I/O: the nearest abuse is an EL1 system register at EL0.
        #[cfg(target_arch = "aarch64")]
        "el1-register" => {
            // SAFETY: reading TTBR0_EL1 at EL0 is an undefined instruction: a fatal trap.
            unsafe { core::arch::asm!("mrs {0}, ttbr0_el1", out(reg) _, options(nomem, nostack)) };
            stopped(mode, 0)
        }
        "stack-overflow" => {
            let depth = recurse(0);
            println!("hostile {mode}: UNEXPECTED: recursion returned at depth {depth}");
            exit(1)
        }
        _ => {
            println!("usage: hostile MODE; modes:");
            for mode in MODES {
                println!("  {mode}");
            }
            exit(2)
        }
    }
}

activm_stub::vcpu_entry!(main);

fn mem_size() -> u64 {
    boot_info().mem_size
}

fn heap() -> u64 {
    (boot_info().heap_start + 4095) & !4095
}

/// Hypercall `nr` with raw arguments.
pub fn raw_nr(nr: u64, a0: u64, a1: u64, a2: u64) -> u64 {
    // SAFETY: hostile on purpose: the VMM must check every argument; no guest memory is handed
    // out that the guest still uses.
    unsafe { hypercall::raw(nr, a0, a1, a2, 0) }
}

pub fn raw(call: Hypercall, a0: u64, a1: u64, a2: u64) -> u64 {
    raw_nr(call as u64, a0, a1, a2)
}

fn blk(call: Hypercall, sector: u64, gpa: u64, count: u64) -> u64 {
    raw(call, sector, gpa, count)
}

/// An 8-byte load from `addr`.
fn load(addr: u64) -> u64 {
    // SAFETY: a load from the hypercall page's mapping: the VMM handles or refuses it.
    unsafe { arch::load64(addr) }
}

/// Loads and stores of an exact width (the VMM tells them apart), in each architecture's
/// instructions. Each is a single access at `addr`.
#[cfg(target_arch = "x86_64")]
mod arch {
    /// # Safety
    /// `addr` is the hypercall page's mapping (the VMM handles or refuses the access).
    pub unsafe fn load64(addr: u64) -> u64 {
        let value: u64;
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("mov {v}, qword ptr [{a}]", a = in(reg) addr, v = out(reg) value, options(nostack))
        };
        value
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn load32(addr: u64) -> u32 {
        let value: u32;
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("mov {v:e}, dword ptr [{a}]", a = in(reg) addr, v = out(reg) value, options(nostack))
        };
        value
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn store64(addr: u64, value: u64) {
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("mov qword ptr [{a}], {v}", a = in(reg) addr, v = in(reg) value, options(nostack))
        };
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn store8(addr: u64, value: u8) {
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("mov byte ptr [{a}], {v}", a = in(reg) addr, v = in(reg_byte) value, options(nostack))
        };
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    /// # Safety
    /// `addr` is the hypercall page's mapping (the VMM handles or refuses the access).
    pub unsafe fn load64(addr: u64) -> u64 {
        let value: u64;
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("ldr {v}, [{a}]", a = in(reg) addr, v = out(reg) value, options(nostack))
        };
        value
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn load32(addr: u64) -> u32 {
        let value: u32;
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("ldr {v:w}, [{a}]", a = in(reg) addr, v = out(reg) value, options(nostack))
        };
        value
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn store64(addr: u64, value: u64) {
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("str {v}, [{a}]", a = in(reg) addr, v = in(reg) value, options(nostack))
        };
    }

    /// # Safety
    /// As [`load64`].
    pub unsafe fn store8(addr: u64, value: u8) {
        // SAFETY: as the caller guarantees.
        unsafe {
            core::arch::asm!("strb {v:w}, [{a}]", a = in(reg) addr, v = in(reg) u32::from(value), options(nostack))
        };
    }
}

/// The VMM should have stopped the guest in the call that returned `result`.
pub fn stopped(mode: &str, result: u64) -> ! {
    println!("hostile {mode}: UNEXPECTED: the VMM let the guest go on (result {result:#x})");
    exit(1)
}

/// The VMM answered with the documented code (or survived the abuse): exit 0 if `ok`.
pub fn refused(mode: &str, ok: bool, what: core::fmt::Arguments<'_>) -> ! {
    if ok {
        println!("hostile {mode}: ok ({what})");
        exit(0)
    }
    println!("hostile {mode}: UNEXPECTED: {what}");
    exit(1)
}

/// Recurse with 4 KiB frames until something stops the guest.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let mut frame = [0u8; 4096];
    frame[0] = depth as u8;
    let frame = core::hint::black_box(&mut frame);
    if depth == u64::MAX {
        return depth;
    }
    recurse(depth + 1) + u64::from(frame[4095])
}

/// Every vCPU issues 10000 cheap hypercalls (a block-device question, a `sa_preempt` of a vCPU
/// that does not exist, an empty console write); vCPU 0 exits 0 when all are done and every
/// result was the documented one.
fn flood(vcpu: u32) -> ! {
    use core::sync::atomic::{AtomicU32, Ordering};
    static DONE: AtomicU32 = AtomicU32::new(0);
    static BAD: AtomicU32 = AtomicU32::new(0);
    const CALLS: u32 = 10_000;
    let sectors = raw(Hypercall::BlkInfo, 0, 0, 0);
    for i in 0..CALLS {
        let ok = match i % 3 {
            0 => raw(Hypercall::BlkInfo, 0, 0, 0) == sectors,
            1 => raw(Hypercall::SaPreempt, 1000, 0, 0) == HC_UNSUPPORTED,
            _ => raw(Hypercall::ConsoleWrite, heap(), 0, 0) == 0,
        };
        if !ok {
            BAD.fetch_add(1, Ordering::Relaxed);
        }
    }
    DONE.fetch_add(1, Ordering::AcqRel);
    if vcpu != 0 {
        vcpu_stop()
    }
    while DONE.load(Ordering::Acquire) < activm_stub::nr_vcpus() {
        activm_stub::pause();
    }
    let bad = BAD.load(Ordering::Relaxed);
    let n = activm_stub::nr_vcpus();
    refused(
        "hypercall-flood",
        bad == 0,
        format_args!("{n} vCPUs x {CALLS} calls, {bad} unexpected results"),
    )
}
