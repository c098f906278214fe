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

/// Every differential case again, three times, with each vCPU's timer preempting threads at
/// random points every 20-200 us and spinning threads competing for the vCPUs: the transcripts
/// must not change (races in the timed waits, the rendezvous and the once-cells would show).
pub fn std_cases_preempted() -> TestResult {
    let calm: Result<alloc::vec::Vec<String>, String> = crate::std_cases::CASES
        .iter()
        .map(|&(_, case)| case())
        .collect();
    let calm = calm?;
    let before = activm_rt::stats::snapshot();
    activm_rt::config::set_random_preemption(Some((
        core::time::Duration::from_micros(20),
        core::time::Duration::from_micros(200),
    )));
    let stop = alloc::sync::Arc::new(core::sync::atomic::AtomicBool::new(false));
    let spinners: alloc::vec::Vec<_> = (0..rt::nr_vcpus())
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(core::sync::atomic::Ordering::Relaxed) {
                    x = core::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    let mut result = Ok(());
    'rounds: for round in 0..3 {
        for (&(name, case), want) in crate::std_cases::CASES.iter().zip(&calm) {
            match case() {
                Ok(got) if &got == want => {}
                Ok(got) => {
                    result = Err(format!("round {round}, {name}: {got}\n  calm: {want}"));
                    break 'rounds;
                }
                Err(why) => {
                    result = Err(format!("round {round}, {name}: {why}"));
                    break 'rounds;
                }
            }
        }
    }
    stop.store(true, core::sync::atomic::Ordering::Relaxed);
    for h in spinners {
        h.join().map_err(|_| "join")?;
    }
    activm_rt::config::set_random_preemption(None);
    result?;
    let preemptions = activm_rt::stats::snapshot().preemptions - before.preemptions;
    Ok(format!(
        "{} cases x 3 rounds unchanged under {preemptions} random preemptions",
        calm.len()
    ))
}
