//! Random bytes for the guest: a ChaCha20 generator (`rand_chacha`) seeded with 32 bytes the
//! VMM took from the host's `getrandom(2)` for this guest at this start (`BootInfo`), so two
//! guests, or two runs of one, never share a stream, and nothing the guest can observe (its
//! clock, its addresses) predicts it.
//!
//! Each call takes 64 bytes from the shared generator under a short lock: the first 32 rekey the
//! shared generator in place (so its state cannot recompute what it gave out before: "fast key
//! erasure"), the other 32 key a generator of the caller's own that fills the buffer outside
//! the lock. std's `sys_read_entropy` (HashMap seeds, `getrandom` users such as `rand`'s
//! `OsRng`) comes here.
//!
//! A VMM that sent no seed (`BOOT_FLAG_ENTROPY` clear) leaves only the TSC: the stream is then
//! predictable, [`from_host`] says so, and the first use prints a warning.

use activm_stub::sync::SpinLock;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// The shared generator, made at first use.
static SHARED: SpinLock<Option<(ChaCha20Rng, bool)>> = SpinLock::new(None);

/// A fresh key from the shared generator (made from the VMM's seed on first use).
fn next_key() -> ([u8; 32], bool) {
    let mut shared = SHARED.lock();
    let (rng, from_host) = shared.get_or_insert_with(|| match activm_stub::take_entropy_seed() {
        Some(seed) => (ChaCha20Rng::from_seed(seed), true),
        None => {
            let mut seed = [0u8; 32];
            for (i, chunk) in seed.chunks_mut(8).enumerate() {
                let mixed = activm_stub::rdtsc().rotate_left(17 * i as u32) ^ 0x9E37_79B9_7F4A_7C15;
                chunk.copy_from_slice(&mixed.to_le_bytes());
            }
            (ChaCha20Rng::from_seed(seed), false)
        }
    });
    let mut next = [0u8; 32];
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut next);
    rng.fill_bytes(&mut key);
    *rng = ChaCha20Rng::from_seed(next);
    (key, *from_host)
}

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) {
    let (key, from_host) = next_key();
    if !from_host {
        warn_once();
    }
    ChaCha20Rng::from_seed(key).fill_bytes(buf);
}

/// Whether the generator is seeded from the host (false: the VMM sent no seed, and the output
/// is predictable).
pub fn from_host() -> bool {
    next_key().1
}

fn warn_once() {
    use core::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        activm_stub::println!(
            "activm-rt: warning: the VMM sent no entropy seed; random bytes are predictable"
        );
    }
}
