//! Where the runtime's API deliberately or necessarily differs from std's, checked on its own
//! (not differential): a thread name with a NUL byte, `available_parallelism`, and the error
//! types std has no equivalent of.

use alloc::format;
use alloc::string::String;

use activm_rt::{io, rt, thread, thread_local};

use crate::TestResult;

thread_local! {
    static LOCAL: u32 = const { 1 };
}

pub fn thread_api() -> TestResult {
    // std's `Builder::spawn` panics on a NUL in the name; here it is an `InvalidInput` error.
    let err = match thread::Builder::new().name("a\0b".into()).spawn(|| ()) {
        Ok(_) => return Err("a name with a NUL byte was accepted".into()),
        Err(e) => e,
    };
    if err.kind() != io::ErrorKind::InvalidInput {
        return Err(format!("NUL in a name: {:?}", err.kind()));
    }
    let shown = show(err);
    let n = thread::available_parallelism().map_err(|e| format!("{e}"))?;
    if n.get() != rt::nr_vcpus() as usize {
        return Err(format!(
            "available_parallelism {n}, {} vCPUs",
            rt::nr_vcpus()
        ));
    }
    let ok = thread::Builder::new()
        .name("no-nul".into())
        .spawn(|| thread::current().name().map(String::from))
        .map_err(|e| format!("{e}"))?
        .join()
        .map_err(|_| "join")?;
    if ok.as_deref() != Some("no-nul") {
        return Err(format!("named thread sees {ok:?}"));
    }
    LOCAL.with(|v| assert_eq!(*v, 1));
    Ok(format!(
        "NUL name: InvalidInput ({shown}); available_parallelism {n}; AccessError: {}",
        show(thread::AccessError)
    ))
}

fn show<E: core::error::Error>(e: E) -> String {
    format!("{e}")
}
