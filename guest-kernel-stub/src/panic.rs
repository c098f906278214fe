//! The panic handler: "[context ]panicked on vCPU N at file:line: message", sent with the `panic`
//! hypercall (which stops the guest). The layer above may add context (the thread runtime names
//! the panicking thread) with [`set_panic_context`].

use core::fmt::Write;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::arch::current::percpu;
use crate::console::FixedBuf;

/// Writes context (e.g. "thread 'worker' ") at the start of a panic message.
pub type PanicContext = fn(&mut dyn Write);

static CONTEXT: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Installs a function that writes a prefix into every panic message.
pub fn set_panic_context(context: PanicContext) {
    CONTEXT.store(context as *mut (), Ordering::Release);
}

// A `std` guest (target_os = "hermit", see activm-std) has std's panic handler instead.
#[cfg_attr(not(target_os = "hermit"), panic_handler)]
#[cfg_attr(target_os = "hermit", allow(dead_code))]
fn panic(info: &PanicInfo<'_>) -> ! {
    if percpu::this_cpu().enter_panic() {
        crate::hypercall::panic(b"panicked while panicking");
    }
    let mut msg = FixedBuf::<1024>::new();
    let context = CONTEXT.load(Ordering::Acquire);
    if !context.is_null() {
        // SAFETY: only `set_panic_context` stores non-null values, all `PanicContext`s.
        let context = unsafe { core::mem::transmute::<*mut (), PanicContext>(context) };
        context(&mut msg);
    }
    let _ = write!(msg, "panicked on vCPU {} at ", percpu::vcpu_id());
    let _ = match info.location() {
        Some(loc) => write!(msg, "{}:{}", loc.file(), loc.line()),
        None => msg.write_str("<unknown location>"),
    };
    let _ = write!(msg, ": {}", info.message());
    crate::hypercall::panic(msg.as_bytes())
}
