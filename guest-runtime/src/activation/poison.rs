//! `--rt-poison-stacks=on` (testing): finds an activation stack used after it went back to the
//! pool. A stack given back is filled with [`POISON`] (not a valid address: a return or a load
//! through a word popped from it faults at once) and marked free until it is handed out again
//! (to a new activation by the VMM, or as a spare to a suspension). Then:
//!
//! * a CPU exception whose stack pointer lies on a free stack, or with the poison in a
//!   register, ends the guest with `activation stack ... used after it was given back`
//!   ([`explain_fault`]);
//! * a spare taken (for a suspension, or for the VMM's pool) must still be all poison, else
//!   `written while free` (the VMM's pool is not checked: a new activation's entry and its
//!   interrupts write on the stack before any check could run);
//! * giving back a free stack (`given back twice`) or the stack the caller runs on ends it too.
//!
//! Off (the default), `stacks` calls none of this but [`on`].

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use activm_stub::console::FixedBuf;

/// The fill: non-canonical on x86_64, not a user address on aarch64.
pub const POISON: u64 = 0xdead_57ac_dead_57ac;

static ON: AtomicBool = AtomicBool::new(false);

/// Per registered stack (the index of its top in `stacks`' record): given back and not handed
/// out since.
static FREE: [AtomicBool; super::stacks::MAX_ACT_STACKS] =
    [const { AtomicBool::new(false) }; super::stacks::MAX_ACT_STACKS];

/// Turns poisoning on (before the first stack is given back: `config`).
pub(crate) fn set(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether poisoning is on (one relaxed load: the only cost when it is off).
#[inline]
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

fn fail(args: core::fmt::Arguments<'_>) -> ! {
    let mut msg = FixedBuf::<512>::new();
    let _ = msg.write_fmt(args);
    let _ = write!(
        msg,
        " (--rt-poison-stacks, vCPU {})",
        activm_stub::vcpu_id()
    );
    activm_stub::hypercall::panic(msg.as_bytes())
}

fn here() -> u64 {
    let probe = 0u8;
    core::ptr::addr_of!(probe) as u64
}

/// The lowest address [`given_back`] fills under `top` (a stack's allocation may start up to 15
/// bytes above `top - ACT_STACK_SIZE`: its top is rounded down).
fn low(top: u64) -> u64 {
    top - super::stacks::ACT_STACK_SIZE as u64 + 16
}

/// The words of the stack under `top` that [`given_back`] fills: all of it but the top word
/// (the VMM writes a new activation's zero return address there).
fn words(top: u64) -> *mut [u64] {
    let lo = low(top);
    core::ptr::slice_from_raw_parts_mut(lo as *mut u64, ((top - 8 - lo) / 8) as usize)
}

/// `top` goes back to the pool: fills it and marks it free, or ends the guest if it is free
/// already or the caller runs on it. Called before `stacks` clears the entry's words.
pub(crate) fn given_back(top: u64) {
    let Some(i) = super::stacks::index_of(top) else {
        if super::stacks::record_full() {
            return; // Not tracked.
        }
        fail(format_args!(
            "giving back {top:#x}, not an activation stack top"
        ));
    };
    let sp = here();
    if super::stacks::on_act_stack(top, sp) {
        fail(format_args!(
            "giving back activation stack {top:#x} from code running on it (sp {sp:#x})"
        ));
    }
    if FREE[i].swap(true, Ordering::AcqRel) {
        fail(format_args!(
            "activation stack {top:#x} given back twice (free since its last release)"
        ));
    }
    // SAFETY: a stack nobody runs on (checked above for the caller; its owner gave it back):
    // `words` lies inside it.
    unsafe { (*words(top)).fill(POISON) };
}

/// `top` is handed out (a spare to a suspension, or the VMM's pool to a new activation, which
/// reached its start or was dropped in its entry): no longer free.
pub(crate) fn handed_out(top: u64) {
    if let Some(i) = super::stacks::index_of(top) {
        FREE[i].store(false, Ordering::Release);
    }
}

/// A free stack (a spare taken, for the VMM's pool or a suspension) must be all poison but the
/// entry's words `stacks` cleared. Stacks not filled (the spares made before the runtime read
/// its arguments) are not checked.
pub(crate) fn check_free(top: u64, what: &str) {
    if !super::stacks::index_of(top).is_some_and(|i| FREE[i].load(Ordering::Acquire)) {
        return;
    }
    let cleared = super::stacks::cleared_words(top);
    let words = words(top);
    let first = words as *const u64;
    // Volatile: what is looked for is a write nothing should make (a context still on it).
    // SAFETY: `i < words.len()`, a word of a free stack (inside it).
    let word = |i: usize| unsafe { first.add(i).read_volatile() };
    let bad = (0..words.len()).find(|&i| {
        let (at, w) = (first as u64 + 8 * i as u64, word(i));
        w != POISON && !(w == 0 && cleared.contains(&at))
    });
    if let Some(i) = bad {
        let (at, w) = (first as u64 + 8 * i as u64, word(i));
        fail(format_args!(
            "activation stack {top:#x} written while free (found {w:#x} at {at:#x}, {} bytes \
             under the top, when {what})",
            top - at
        ));
    }
}

/// A CPU exception (`number` at `pc`, stack pointer `sp`, fault address `addr`; `regs(v)`:
/// whether a general register holds `v`): ends the guest with an explanation if its stack
/// pointer lies on a free stack, or the poison is in a register or the fault address (on our
/// kvm_pvm hosts a load through a non-canonical address is a `#PF`). Returns otherwise.
pub(crate) fn explain_fault(number: u64, pc: u64, sp: u64, addr: u64, regs: impl Fn(u64) -> bool) {
    if !on() {
        return;
    }
    let seen = if regs(POISON) || addr == POISON || pc == POISON {
        ", the poison in a register"
    } else {
        ""
    };
    if let Some(top) = super::stacks::act_stack_top_of(sp) {
        let free = super::stacks::index_of(top).is_some_and(|i| FREE[i].load(Ordering::Acquire));
        if free {
            fail(format_args!(
                "activation stack {top:#x} used after it was given back: exception {number} at \
                 pc {pc:#x} (fault address {addr:#x}) with sp {sp:#x} on it{seen}"
            ));
        }
    }
    if !seen.is_empty() {
        fail(format_args!(
            "a value from a given-back activation stack in use: exception {number} at pc \
             {pc:#x} (fault address {addr:#x}) sp {sp:#x}{seen}"
        ));
    }
}
