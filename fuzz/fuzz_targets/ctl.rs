//! Control-socket messages: one line as the server reads it, parsed as JSON and answered by
//! `ctl::handle` against a monitor with no guest. Every answer is an object with `ok`.

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use activm::allocator::Allocator;
use activm::guest::Processors;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    static PROCS: OnceLock<Processors> = OnceLock::new();
    let procs = PROCS.get_or_init(|| Processors::new(Allocator::new(2, Duration::from_millis(10))));
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(request) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let answer = activm::ctl::handle(&request, &[], procs);
    assert!(answer.get("ok").is_some_and(Value::is_boolean), "{answer}");
});
