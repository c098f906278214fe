//! The TOML configuration file: parsed, then checked and turned into a run plan exactly as
//! `activm run --config FILE` does. Any text must give a plan or a `Problem` with a status.

#![no_main]

use std::path::Path;

use activm::config::{build, parse, Source};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/nonexistent/activm-fuzz/guests.toml");
    match parse(text, path) {
        Ok((machine, guests)) => {
            if let Err(problem) = build(&machine, &guests, &Source::File(path.into()), 0) {
                assert!(problem.status == 1 || problem.status == 2);
            }
        }
        Err(problem) => assert!(problem.status == 2, "{problem}"),
    }
});
