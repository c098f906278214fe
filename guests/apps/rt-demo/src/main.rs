//! activm-rt demo: `THREADS` threads (default 8) each add 1 to a mutex-protected counter
//! `ITERATIONS` times (default 10000); main joins them, prints the total and exits 0 if it is
//! exact. Usage: `activm run rt-demo --vcpus 4 -- [THREADS [ITERATIONS]]`.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::vec::Vec;

use activm_rt::println;
use activm_rt::sync::{Arc, Mutex};
use activm_rt::thread;

fn main(args: &[&str]) -> i32 {
    let threads: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(8);
    let iterations: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let counter = Arc::new(Mutex::new(0u64));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let counter = counter.clone();
            thread::Builder::new()
                .name(format!("adder-{i}"))
                .spawn(move || {
                    for _ in 0..iterations {
                        *counter.lock().unwrap() += 1;
                    }
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = *counter.lock().unwrap();
    let expected = threads * iterations;
    println!(
        "rt-demo: {threads} threads x {iterations} increments on {} vCPUs: total {total} (expected {expected})",
        thread::available_parallelism().map_or(0, |n| n.get())
    );
    if total == expected {
        0
    } else {
        1
    }
}

activm_rt::main!(main);
