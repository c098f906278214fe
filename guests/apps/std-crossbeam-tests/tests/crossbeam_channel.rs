//! crossbeam-channel's integration tests, one module per file of its `tests/` directory
//! (build.rs writes the `#[path]` modules), in one libtest binary: `list::smoke`, ...

include!(concat!(env!("OUT_DIR"), "/suite.rs"));
