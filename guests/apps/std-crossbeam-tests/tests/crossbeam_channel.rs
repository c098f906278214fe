//! crossbeam-channel's integration tests, one module per file of its `tests/` directory
//! (build.rs writes the `#[path]` modules), in one libtest binary: `list::smoke`, ...

// crossbeam's own tests (unmodified) put diverging arms in `select!` on purpose, to test it.
#![allow(clippy::diverging_sub_expression, clippy::never_loop)]

include!(concat!(env!("OUT_DIR"), "/suite.rs"));
