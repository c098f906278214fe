//! Every vCPU prints one line from the unprivileged level (x86_64 CPL3, aarch64 EL0); vCPU 0 waits for all of them and exits 0.
#![no_std]
#![no_main]

use core::sync::atomic::{AtomicU32, Ordering};

use activm_stub::{current_level_name, exit, nr_vcpus, pause, println, vcpu_stop};

static REPORTED: AtomicU32 = AtomicU32::new(0);

fn main(vcpu: u32) -> ! {
    let n = nr_vcpus();
    println!("hello from vCPU {vcpu} of {n} at {}", current_level_name());
    REPORTED.fetch_add(1, Ordering::AcqRel);
    if vcpu != 0 {
        vcpu_stop();
    }
    while REPORTED.load(Ordering::Acquire) < n {
        pause();
    }
    println!("all {n} vCPUs reported");
    exit(0)
}

activm_stub::vcpu_entry!(main);
