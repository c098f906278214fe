//! rayon on activm: parallel results must equal the serial ones.

use rayon::prelude::*;

/// A deterministic pseudo-random sequence (xorshift64*).
fn data(n: usize) -> Vec<u64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 16
        })
        .collect()
}

fn main() {
    let v = data(1_000_000);
    println!("threads: {}", rayon::current_num_threads());

    let serial: u64 = v.iter().map(|x| x % 1000).sum();
    let parallel: u64 = v.par_iter().map(|x| x % 1000).sum();
    println!(
        "sum: {}",
        if serial == parallel {
            "equal"
        } else {
            "DIFFERENT"
        }
    );

    let mut a = v.clone();
    let mut b = v.clone();
    a.sort_unstable();
    b.par_sort_unstable();
    println!("sort: {}", if a == b { "equal" } else { "DIFFERENT" });
    let mut c = v.clone();
    c.par_sort();
    println!(
        "stable sort: {}",
        if a == c { "equal" } else { "DIFFERENT" }
    );

    let squares: Vec<u64> = v.par_iter().map(|x| x.wrapping_mul(*x)).collect();
    let ok = squares
        .iter()
        .zip(&v)
        .all(|(s, x)| *s == x.wrapping_mul(*x));
    println!("map+collect: {}", if ok { "equal" } else { "DIFFERENT" });

    let (left, right) = rayon::join(|| fib(25), || fib(24));
    println!("join: fib(25)+fib(24) = {}", left + right);
    let ok = serial == parallel && a == b && a == c && ok && left + right == 121_393;
    std::process::exit(if ok { 0 } else { 1 });
}

fn fib(n: u32) -> u64 {
    if n < 2 {
        return u64::from(n);
    }
    if n < 15 {
        return fib(n - 1) + fib(n - 2);
    }
    let (a, b) = rayon::join(|| fib(n - 1), || fib(n - 2));
    a + b
}
