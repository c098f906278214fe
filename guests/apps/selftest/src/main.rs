//! Behaviour chosen by the first guest argument, for the VMM's integration tests. vCPUs other
//! than 0 stop at once unless the mode uses them (`cpl`, `smp`).
#![no_std]
#![no_main]

extern crate alloc;

mod blk;
mod sa;
#[cfg(target_arch = "x86_64")]
mod x86;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::hypercall::Hypercall;
use activm_stub::{args, current_cpl, exit, hypercall, nr_vcpus, pause, println, vcpu_stop};

const USAGE: &str = concat!(
    "usage: selftest MODE [ARGS]\n",
    "modes: exit N | panic | cpl | privileged | null | unknown-hypercall | misaligned-hypercall |\n",
    "       bad-pointer | store-hypercall | fp | smp | args | spin | heap | irq | irq-stress | sa |\n",
    "       sa-signal | sa-hostile | sa-spin | sa-defer | ipi-latency | blk-bad-buffer |\n",
    "       blk-async CASE\n",
    "(privileged, null, misaligned-hypercall, store-hypercall, irq, irq-stress and ipi-latency:\n",
    " x86_64 only)",
);

/// vCPUs that have finished their part of `cpl` or `smp`.
static DONE: AtomicU32 = AtomicU32::new(0);
/// The counter of `smp`.
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn main(vcpu: u32) -> ! {
    let mut argv = args();
    let mode = argv.next().unwrap_or("");
    match mode {
        "cpl" => cpl(vcpu),
        "smp" => smp(vcpu),
        #[cfg(target_arch = "x86_64")]
        "irq-stress" => x86::irq_stress(vcpu),
        "sa" => sa::run(vcpu),
        "sa-signal" => sa::signal(vcpu),
        "sa-hostile" => sa::hostile(vcpu),
        "sa-spin" => sa::spin(vcpu, argv.next().and_then(|s| s.parse().ok())),
        "sa-defer" => sa::defer(vcpu),
        #[cfg(target_arch = "x86_64")]
        "ipi-latency" => x86::ipi_latency(vcpu),
        _ if vcpu != 0 => vcpu_stop(),
        "exit" => {
            let code = argv.next().and_then(|s| s.parse::<i32>().ok());
            match code {
                Some(code) => exit(code),
                None => usage(),
            }
        }
        "panic" => panic!("selftest panic on purpose"),
        #[cfg(target_arch = "x86_64")]
        "privileged" => x86::privileged(),
        #[cfg(target_arch = "x86_64")]
        "null" => x86::null(),
        "unknown-hypercall" => {
            // SAFETY: an unknown call number stops the guest; nothing is passed.
            unsafe { hypercall::raw(0x1FF, 0, 0, 0, 0) };
            panic!("unknown hypercall returned");
        }
        #[cfg(target_arch = "x86_64")]
        "misaligned-hypercall" => x86::misaligned_hypercall(),
        "bad-pointer" => {
            // SAFETY: the VMM must reject the buffer (outside guest memory) and stop the guest.
            unsafe { hypercall::raw(Hypercall::ConsoleWrite as u64, 0x7fff_0000_0000, 16, 0, 0) };
            panic!("console_write with a bad pointer returned");
        }
        #[cfg(target_arch = "x86_64")]
        "store-hypercall" => x86::store_hypercall(),
        "blk-async" => blk::run(argv.next().unwrap_or("")),
        "blk-bad-buffer" => {
            // SAFETY: the VMM must refuse a buffer in its own memory (page tables at 0x1000)
            // and stop the guest before writing anything.
            unsafe { hypercall::blk_read(0, 0x1000 as *mut u8, 1) };
            panic!("blk_read into VMM memory returned");
        }
        "fp" => fp(),
        "args" => print_args(),
        "spin" => loop {
            pause();
        },
        "heap" => heap(),
        #[cfg(target_arch = "x86_64")]
        "irq" => x86::irq(),
        _ => usage(),
    }
}

activm_stub::vcpu_entry!(main);

fn usage() -> ! {
    println!("{USAGE}");
    exit(2)
}

/// Waits at CPL3 until all vCPUs are done.
fn wait_all() {
    while DONE.load(Ordering::Acquire) < nr_vcpus() {
        pause();
    }
}

fn cpl(vcpu: u32) -> ! {
    println!("vcpu {vcpu} cpl={}", current_cpl());
    DONE.fetch_add(1, Ordering::AcqRel);
    if vcpu != 0 {
        vcpu_stop();
    }
    wait_all();
    exit(0)
}

fn smp(vcpu: u32) -> ! {
    const PER_VCPU: u64 = 1_000_000;
    for _ in 0..PER_VCPU {
        COUNTER.fetch_add(1, Ordering::Relaxed);
    }
    DONE.fetch_add(1, Ordering::AcqRel);
    if vcpu != 0 {
        vcpu_stop();
    }
    wait_all();
    let total = COUNTER.load(Ordering::Relaxed);
    let expected = u64::from(nr_vcpus()) * PER_VCPU;
    println!("smp total={total} expected={expected}");
    exit(if total == expected { 0 } else { 1 })
}

/// Hardware floating point at CPL3: sum of 1/k^2, k = 1..=1e6 (smallest terms first), which is
/// pi^2/6 - 9.999995e-7.
fn fp() -> ! {
    let mut sum = 0.0f64;
    let mut k = 1_000_000u32;
    while k > 0 {
        let x = f64::from(k);
        sum += 1.0 / (x * x);
        k -= 1;
    }
    let expected = core::f64::consts::PI * core::f64::consts::PI / 6.0;
    println!("fp sum={sum:.6} expected={expected:.6}");
    assert!(
        (sum - expected).abs() < 1e-6,
        "sum {sum} is not within 1e-6 of pi^2/6 = {expected}"
    );
    exit(0)
}

fn print_args() -> ! {
    let argv = args();
    println!("argc={}", argv.len());
    for (i, arg) in argv.enumerate() {
        println!("arg[{i}]={arg}");
    }
    exit(0)
}

fn heap() -> ! {
    let mut v: Vec<u64> = Vec::with_capacity(1 << 20);
    v.extend(0..1u64 << 20);
    let sum: u64 = v.iter().sum();
    assert_eq!(sum, (1u64 << 20) * ((1 << 20) - 1) / 2);
    drop(v);
    let mut strings: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    strings.push(String::from("activm"));
    let joined = strings.concat();
    assert_eq!(joined, "0123456789101112131415activm");
    drop(strings);
    println!("heap ok");
    exit(0)
}
