//! Per-architecture parts of the ABI. Both modules are always compiled (so their layout tests
//! run on any host); `current` is the one for the architecture being built.
//!
//! Both export the same surface, checked by the test below: `UPCALL_IRQ`, `RESCHEDULE_IRQ` and
//! `TIMER_IRQ` (`u8`), `HYPERCALL_BASE` and `IMAGE_BASE` (`u64`), and a `UserContext` with
//! `pc`/`sp`/`result` and their setters. Anything else in a module is that architecture's own.

pub mod aarch64;
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64 as current;
#[cfg(not(target_arch = "aarch64"))]
pub use x86_64 as current;

#[cfg(test)]
mod tests {
    /// Uses every shared name of one architecture module with the type the other one has.
    macro_rules! same_surface {
        ($arch:ident) => {{
            use super::$arch as arch;
            let irqs: [u8; 3] = [arch::UPCALL_IRQ, arch::RESCHEDULE_IRQ, arch::TIMER_IRQ];
            let bases: [u64; 2] = [arch::HYPERCALL_BASE, arch::IMAGE_BASE];
            let mut ctx = arch::UserContext::default();
            ctx.set_pc(0x1000);
            ctx.set_sp(0x2000);
            ctx.set_result(7);
            let regs: [u64; 3] = [ctx.pc(), ctx.sp(), ctx.result()];
            assert_eq!(regs, [0x1000, 0x2000, 7], stringify!($arch));
            let mut distinct = irqs;
            distinct.sort_unstable();
            assert!(distinct.windows(2).all(|w| w[0] != w[1]), stringify!($arch));
            assert!(bases[1] > 0 && bases[0] > 0);
        }};
    }

    #[test]
    fn both_architectures_export_the_same_names() {
        same_surface!(x86_64);
        same_surface!(aarch64);
    }
}
