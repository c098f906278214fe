//! Empty: this package exists for its test target, `tests/crossbeam_channel.rs`, which holds
//! crossbeam-channel's own integration tests (see build.rs).
