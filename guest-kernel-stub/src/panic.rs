//! The panic handler: "panicked on vCPU N at file:line: message", sent with the `panic`
//! hypercall (which stops the guest).

use core::fmt::Write;
use core::panic::PanicInfo;

use crate::arch::current::percpu;
use crate::console::FixedBuf;

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    if percpu::this_cpu().enter_panic() {
        crate::hypercall::panic(b"panicked while panicking");
    }
    let mut msg = FixedBuf::<1024>::new();
    let _ = write!(msg, "panicked on vCPU {} at ", percpu::vcpu_id());
    let _ = match info.location() {
        Some(loc) => write!(msg, "{}:{}", loc.file(), loc.line()),
        None => msg.write_str("<unknown location>"),
    };
    let _ = write!(msg, ": {}", info.message());
    crate::hypercall::panic(msg.as_bytes())
}
