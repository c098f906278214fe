//! The activation state table: what a vCPU's runtime words said when its activation ended
//! (who ran there), filed under the activation id until that activation's record comes.

use core::sync::atomic::Ordering;

use super::bag::Bag;
use super::stacks::release_act_stack;
use crate::arch::cpu::{self, Word};
use crate::arch::entry::{OldWords, CLAIMING};
use crate::percpu;

/// What a vCPU's words said when its activation ended.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
pub(crate) struct ActState {
    pub(crate) activation: u32,
    pub(crate) vcpu: u32,
    pub(crate) current: u64,
    pub(crate) hold: u64,
    pub(crate) in_sched: bool,
    pub(crate) sched_idle: bool,
    /// The activation's scheduler stack, still owned by this state (0: already given back).
    pub(crate) sched_top: u64,
}

/// States filed by new activations (and BLOCKED records), keyed by activation id.
pub(crate) static TABLE: Bag<ActState, 256> = Bag::new();

/// Files the state of the activation a vCPU had before (its new activation took the vCPU).
pub(crate) fn file_old_state(vcpu: u32, old: &OldWords) {
    if old.activation == 0 || old.activation & CLAIMING != 0 {
        return;
    }
    let st = own_stack(ActState {
        activation: old.activation as u32,
        vcpu,
        current: old.current,
        hold: old.hold,
        in_sched: old.in_sched != 0,
        sched_idle: old.sched_idle != 0,
        sched_top: old.sched_top,
    });
    TABLE.push(u64::from(st.activation), st);
}

/// Decides who keeps a taken state's scheduler stack: a scheduler context, or nobody (a thread
/// ran there: the stack is free and goes back to the pool).
fn own_stack(st: ActState) -> ActState {
    if st.in_sched {
        st
    } else {
        release_act_stack(st.sched_top);
        ActState { sched_top: 0, ..st }
    }
}

/// Takes the state of `activation` (on `vcpu`): from the table, or straight from the vCPU's
/// words if its next activation has not started. `None`: not available yet.
pub(crate) fn take_state(activation: u32, vcpu: u32) -> Option<ActState> {
    if let Some(st) = TABLE.take_key(u64::from(activation)) {
        return Some(st);
    }
    if vcpu >= percpu::nr_vcpus() {
        return None;
    }
    let read = |w: Word| cpu::get_of(vcpu, w);
    let st = ActState {
        activation,
        vcpu,
        current: read(Word::Current),
        hold: cpu::hold_of(vcpu),
        in_sched: read(Word::InSched) != 0,
        sched_idle: read(Word::SchedIdle) != 0,
        sched_top: read(Word::SchedTop),
    };
    if cpu::word_of(vcpu, Word::Activation)
        .compare_exchange(
            u64::from(activation),
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Its next activation claimed the words first; its snapshot will be in the table.
        return None;
    }
    // The words are ours: the vCPU's next activation finds nothing to file. It resets them
    // itself; writing them here would race with it (that activation may already be running,
    // holding a spinlock or draining, by the time this line would run).
    Some(own_stack(st))
}

/// Calls `f` with every filed state (diagnostics).
pub(crate) fn for_each_filed(f: impl FnMut(&ActState)) {
    TABLE.for_each_item(f);
}
