//! **activm-std**: ordinary `std` programs as activm guests.
//!
//! Rust's std for `target_os = "hermit"` calls the C ABI of the `hermit-abi` crate (`sys_*`
//! functions) for threads, futexes, time, memory, entropy, I/O and exit. This crate provides
//! those functions on top of activm-rt, plus the guest entry that starts std's runtime
//! (`runtime_entry`, which calls the program's `main`). Link it into a `fn main()` program built
//! for `guests/x86_64-activm-std.json` or `guests/aarch64-activm-std.json` (`cargo xtask app PATH
//! [--arch aarch64]` does it all); see
//! `docs/std-guests.md` for the contract.
//!
//! * threads ([`thread`]): activm-rt's M:N user threads (`sys_spawn2`, `sys_join`, ...);
//! * futexes ([`futex`]): wait queues at user level, keyed by address;
//! * thread-locals ([`emutls`]): the targets use emulated TLS, served from activm-rt's
//!   per-thread table (on x86_64 CPL3 cannot move `%fs` with a thread);
//! * time, memory, entropy, console I/O, exit ([`sys`]);
//! * files in the VMM's mounts ([`fs`]); sockets through the VMM ([`socket`]); `poll`
//!   ([`poll`]) and `eventfd` ([`eventfd`]).
#![no_std]

extern crate alloc;

pub mod emutls;
pub mod errno;
pub mod eventfd;
pub mod fs;
pub mod futex;
pub mod iovec;
pub mod net;
pub mod poll;
pub mod socket;
mod socket_call;
pub mod socket_dup;
pub mod socket_names;
pub mod socket_poll;
pub mod socket_rx;
pub mod socket_timeout;
pub mod socket_tx;
pub mod socket_udp;
mod socket_v6;
pub mod sys;
pub mod thread;

use alloc::ffi::CString;
use alloc::vec::Vec;
use core::ffi::c_char;

extern "C" {
    /// std's runtime entry (library/std/src/sys/pal/hermit): initialises the environment,
    /// calls the C `main` rustc generates for the program (which runs `fn main`), runs the
    /// main thread's TLS destructors and calls `sys_exit` with the result.
    fn runtime_entry(argc: i32, argv: *const *const c_char, env: *const *const c_char) -> !;
}

/// Name passed as `argv[0]`: the guest command line has no program name.
const PROGRAM_NAME: &str = "main";

/// A leaked null-terminated array of leaked NUL-terminated copies of `strings` (std keeps
/// pointers into both for the whole program).
fn c_array<'a>(strings: impl Iterator<Item = &'a str>) -> &'static [*const c_char] {
    let mut array: Vec<*const c_char> = strings
        .map(|s| CString::new(s).unwrap_or_default().into_raw().cast_const())
        .collect();
    array.push(core::ptr::null());
    array.leak()
}

/// activm-rt's main thread: builds `argv` (`main` then the guest arguments minus the runtime's
/// `--rt-*` ones) and the environment (`activm run --env`, the VMM's `KEY=VALUE` strings),
/// then enters std, which never returns.
fn std_main(args: &[&str]) -> i32 {
    let argv = c_array(core::iter::once(PROGRAM_NAME).chain(args.iter().copied()));
    let env = c_array(activm_stub::env());
    let argc = (argv.len() - 1) as i32;
    // SAFETY: argv is a null-terminated array of `argc` NUL-terminated strings and env a
    // null-terminated array of NUL-terminated strings, all leaked (std keeps pointers into
    // them); std's `runtime_entry` is this program's and is called once, from the main thread.
    unsafe { runtime_entry(argc, argv.as_ptr(), env.as_ptr()) }
}

activm_rt::main!(std_main);
