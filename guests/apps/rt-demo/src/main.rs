//! Placeholder (being written).
#![no_std]
#![no_main]
fn main(_vcpu: u32) -> ! {
    activm_rt::placeholder()
}
activm_rt::__stub::vcpu_entry!(main);
