//! The VMM's scheduler activations as the runtime sees them, below the scheduler: the shared
//! area and the `sa_*` calls (`sa`: turning activations on, asking for processors, giving them
//! back), what they cost (`cost`), the activation stack pools (`stacks`), the state table of
//! ended activations (`state`) and the lock-free bag those keep their bookkeeping in (`bag`).
//! Handling the VMM's upcalls, which needs the scheduler, is `crate::upcall`'s.

pub(crate) mod bag;
pub mod cost;
pub(crate) mod poison;
pub mod sa;
pub(crate) mod stacks;
pub(crate) mod state;

use core::sync::atomic::Ordering;

use activm_stub::protocol::hypercall::{Hypercall, HC_UNSUPPORTED};

use crate::percpu;

/// vCPU 0, once every vCPU runs its scheduler: registers the activation entry, fills the stack
/// pool and enables upcalls, unless the VMM does not offer them (`--no-activations`) or the
/// guest said `--rt-sa=off`. Returns whether they are on.
pub fn enable() -> bool {
    if !crate::config::use_sa() {
        return false;
    }
    let entry = crate::arch::entry::entry_address();
    if sa::hypercall(Hypercall::SaRegister, entry) == HC_UNSUPPORTED {
        return false;
    }
    sa::set_enabled(true);
    stacks::refill_pool();
    sa::hypercall(Hypercall::SaSetConcurrency, u64::from(percpu::nr_vcpus()));
    sa::header()
        .requested_concurrency
        .store(percpu::nr_vcpus(), Ordering::Release);
    if sa::hypercall(Hypercall::SaEnable, 0) == HC_UNSUPPORTED {
        sa::set_enabled(false);
        return false;
    }
    true
}
