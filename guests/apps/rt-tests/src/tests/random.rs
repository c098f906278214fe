//! Random bytes (`activm_rt::random`): seeded from the host, the seed gone from `BootInfo`, and
//! output that neither repeats across threads nor skews.

use alloc::format;
use alloc::vec::Vec;

use activm_rt::random;
use activm_rt::thread;

use crate::TestResult;

use super::ensure;

pub(super) fn random_bytes() -> TestResult {
    ensure(random::from_host(), || {
        "the generator is not seeded from the host (BOOT_FLAG_ENTROPY missing?)".into()
    })?;
    ensure(activm_stub::boot_info().entropy_seed == [0; 32], || {
        "the entropy seed is still in the BootInfo copy".into()
    })?;
    // Eight threads draw at once: every 32-byte block differs from every other.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            thread::spawn(|| {
                let mut blocks = [[0u8; 32]; 16];
                for block in &mut blocks {
                    random::fill(block);
                }
                blocks
            })
        })
        .collect();
    let mut all: Vec<[u8; 32]> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    all.dedup();
    ensure(all.len() == 8 * 16, || {
        format!("{} distinct blocks of {}", all.len(), 8 * 16)
    })?;
    // 64 KiB: each byte value about 256 times (the binomial's deviation is 16; allow 8 of it).
    let mut big = alloc::vec![0u8; 65536];
    random::fill(&mut big);
    let mut counts = [0u32; 256];
    for &b in &big {
        counts[usize::from(b)] += 1;
    }
    let (lo, hi) = (counts.iter().min().copied(), counts.iter().max().copied());
    ensure(
        lo.is_some_and(|n| n >= 128) && hi.is_some_and(|n| n <= 384),
        || format!("byte counts in 64 KiB range {lo:?}..{hi:?}, expected about 256 each"),
    )?;
    Ok(format!(
        "{} blocks distinct, byte counts {lo:?}..{hi:?}",
        all.len()
    ))
}
