//! Interrupt handlers, run at CPL3 on the interrupted code's stack with interrupts enabled
//! (after the EOI). A handler may change the interrupted state through the [`IrqFrame`].

use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

pub use crate::arch::current::IrqFrame;

/// An interrupt handler.
pub type IrqHandler = fn(&mut IrqFrame);

static HANDLERS: [AtomicPtr<()>; 256] = [const { AtomicPtr::new(ptr::null_mut()) }; 256];

fn decode(raw: *mut ()) -> Option<IrqHandler> {
    if raw.is_null() {
        None
    } else {
        // SAFETY: only `register_irq_handler` stores non-null values, all `IrqHandler`s.
        Some(unsafe { core::mem::transmute::<*mut (), IrqHandler>(raw) })
    }
}

fn check_vector(vector: u8) {
    assert!(
        crate::arch::current::traps::may_have_handler(vector),
        "vector {vector:#x} cannot have a handler (CPU exceptions are fatal, the spurious vector is ignored)"
    );
}

/// Installs `handler` for `vector` (x86_64: 32..=254); returns the previous one.
pub fn register_irq_handler(vector: u8, handler: IrqHandler) -> Option<IrqHandler> {
    check_vector(vector);
    decode(HANDLERS[vector as usize].swap(handler as *mut (), Ordering::AcqRel))
}

/// Removes the handler of `vector`; returns it.
pub fn unregister_irq_handler(vector: u8) -> Option<IrqHandler> {
    check_vector(vector);
    decode(HANDLERS[vector as usize].swap(ptr::null_mut(), Ordering::AcqRel))
}

/// Runs the handler of `vector`, if any (an interrupt nobody registered for is dropped).
pub(crate) fn run_handler(vector: u8, frame: &mut IrqFrame) {
    if let Some(handler) = decode(HANDLERS[vector as usize].load(Ordering::Acquire)) {
        handler(frame);
    }
}
