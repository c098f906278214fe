//! TODO(aarch64): the same restartable sequences (run queue push/pop with `ldaxr/stlxr` or LSE
//! `cas` as the commit, upcall-record take, idle `wfi`-style halt check, switch-in) and their PC
//! table.
