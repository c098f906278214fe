//! An ordinary async program on activm (tests/kvm/std_async.rs drives it): `poll` of several
//! descriptors and `eventfd` through libc, and a mio TCP echo server (mio's poll selector and
//! eventfd waker, what tokio would run on; tokio's `net` does not build for the Hermit target).
//!
//! * `std-async poll PORT`: `poll`'s timeouts (0, 50 ms, none) on a listener, an eventfd and a
//!   stream together; which descriptor answers; bad arguments (`EFAULT`, `EINVAL`, `POLLNVAL`).
//!   PORT is the published port the guest's listener (`0.0.0.0:80`) is reached through.
//! * `std-async eventfd`: counter and semaphore reads, `EAGAIN`, `EINVAL`, a blocking read woken
//!   by another thread's write, a blocking write woken by a read, and a ping-pong of two
//!   threads through two eventfds (round trips timed).
//! * `std-async self PORT [CONNECTIONS]`: the echo server on `0.0.0.0:80` with a 10 ms timer,
//!   and a mio client thread with CONNECTIONS (default 8) connections to itself through
//!   published port PORT, 64 KiB each way each, every byte checked; stopped through a
//!   `mio::Waker` from the main thread.
//! * `std-async serve CONNECTIONS`: the echo server alone, until CONNECTIONS connections ended.
//!
//! Prints each step; exits 1 with the error on failure.

// libc's eventfd types differ between Linux and Hermit (`c_int` flags against `i16`): the
// casts are needed on one of them.
#![allow(clippy::unnecessary_cast, clippy::useless_conversion)]

mod echo;
mod eventfd;
mod poll;

type Result<T> = std::result::Result<T, String>;

pub(crate) fn ctx<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// `r` of a libc call: the OS error if negative.
pub(crate) fn check(what: &str, r: isize) -> Result<isize> {
    if r < 0 {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    } else {
        Ok(r)
    }
}

fn port(arg: Option<&String>) -> Result<u16> {
    arg.ok_or("a port is needed")?
        .parse()
        .map_err(ctx("the port"))
}

fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("poll") => poll::run(port(args.get(1))?),
        Some("eventfd") => eventfd::run(),
        Some("self") => {
            let connections = match args.get(2) {
                Some(n) => n.parse().map_err(ctx("CONNECTIONS"))?,
                None => 8,
            };
            echo::to_itself(port(args.get(1))?, connections)
        }
        Some("serve") => {
            let n = args.get(1).ok_or("CONNECTIONS is needed")?;
            echo::serve(n.parse().map_err(ctx("CONNECTIONS"))?)
        }
        _ => Err("usage: std-async poll PORT | eventfd | self PORT [N] | serve N".into()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("std-async: {e}");
        std::process::exit(1);
    }
}
