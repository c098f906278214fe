//! The GICv3, from EL0. The distributor and this vCPU's redistributor are mapped EL0
//! read-write (docs/protocol.md, section 3), like the x86 local APIC page: enabling and routing
//! interrupts needs no privilege and no VMM exit. Acknowledge and EOI are system registers
//! (ICC_IAR1_EL1, ICC_EOIR1_EL1) the EL1 stub uses on interrupt entry.

use protocol::arch::aarch64::{
    GICD_BASE, GICR_BASE, GICR_STRIDE, INTID_UPCALL_BASE, RESCHEDULE_IRQ, TIMER_IRQ,
};

/// Distributor registers.
const GICD_CTLR: u64 = 0x0000;
const GICD_IGROUPR: u64 = 0x0080;
const GICD_ISENABLER: u64 = 0x0100;
const GICD_ISPENDR: u64 = 0x0200;
const GICD_ICFGR: u64 = 0x0C00;
const GICD_IROUTER: u64 = 0x6000;
/// GICD_CTLR: EnableGrp1 (non-secure view, single security state) and ARE.
const GICD_CTLR_ENABLE: u32 = (1 << 1) | (1 << 4);
/// Redistributor SGI/PPI frame (the second 64 KiB of each redistributor).
const GICR_SGI_FRAME: u64 = 0x1_0000;
const GICR_IGROUPR0: u64 = GICR_SGI_FRAME + 0x0080;
const GICR_ISENABLER0: u64 = GICR_SGI_FRAME + 0x0100;

fn write32(addr: u64, value: u32) {
    // SAFETY: `addr` is a GIC register in the device region the VMM maps EL0 read-write.
    unsafe { (addr as *mut u32).write_volatile(value) }
}

fn read32(addr: u64) -> u32 {
    // SAFETY: as `write32`.
    unsafe { (addr as *const u32).read_volatile() }
}

fn write64(addr: u64, value: u64) {
    // SAFETY: as `write32`.
    unsafe { (addr as *mut u64).write_volatile(value) }
}

/// The affinity KVM gives vCPU `vcpu` (its MPIDR_EL1), in GICD_IROUTER form.
fn affinity(vcpu: u32) -> u64 {
    u64::from(vcpu & 0xf) | (u64::from((vcpu >> 4) & 0xff) << 8)
}

/// This vCPU's upcall SPI.
pub fn upcall_intid(vcpu: u32) -> u32 {
    INTID_UPCALL_BASE + vcpu
}

/// Enables this vCPU's private interrupts (the timer and the reschedule SGI) in its
/// redistributor, and its upcall SPI (edge-triggered, group 1, routed to it) in the distributor.
pub(crate) fn enable() {
    let vcpu = super::percpu::vcpu_id();
    let private = (1 << TIMER_IRQ) | (1 << RESCHEDULE_IRQ);
    let redist = GICR_BASE + u64::from(vcpu) * GICR_STRIDE;
    write32(
        redist + GICR_IGROUPR0,
        read32(redist + GICR_IGROUPR0) | private,
    );
    write32(redist + GICR_ISENABLER0, private);

    let spi = upcall_intid(vcpu);
    let (word, bit) = (u64::from(spi / 32) * 4, spi % 32);
    write64(
        GICD_BASE + GICD_IROUTER + 8 * u64::from(spi),
        affinity(vcpu),
    );
    // Two configuration bits per INTID; 0b10 = edge-triggered. Each vCPU owns its own field,
    // but the word is shared: the read-modify-write is made under the stub's lock.
    let _guard = GIC_LOCK.lock();
    let cfg = GICD_BASE + GICD_ICFGR + u64::from(spi / 16) * 4;
    write32(cfg, read32(cfg) | (2 << ((spi % 16) * 2)));
    let group = GICD_BASE + GICD_IGROUPR + word;
    write32(group, read32(group) | (1 << bit));
    write32(GICD_BASE + GICD_ISENABLER + word, 1 << bit);
    write32(GICD_BASE + GICD_CTLR, GICD_CTLR_ENABLE);
}

static GIC_LOCK: crate::sync::SpinLock<()> = crate::sync::SpinLock::new(());

/// Enables SGI `intid` (0..16, group 1) on this vCPU, for a layer above's own SGIs.
pub fn enable_sgi(intid: u32) {
    let redist = GICR_BASE + u64::from(super::percpu::vcpu_id()) * GICR_STRIDE;
    let bit = 1 << (intid & 0xf);
    // The redistributor is this vCPU's own: nobody else writes its group register.
    write32(redist + GICR_IGROUPR0, read32(redist + GICR_IGROUPR0) | bit);
    write32(redist + GICR_ISENABLER0, bit);
}

/// Makes vCPU `vcpu`'s upcall SPI pending, as the VMM's `KVM_IRQ_LINE` does (one EL0 write of
/// the distributor's set-pending register; no exit).
pub fn raise_upcall(vcpu: u32) {
    let spi = upcall_intid(vcpu);
    write32(
        GICD_BASE + GICD_ISPENDR + u64::from(spi / 32) * 4,
        1 << (spi % 32),
    );
}

/// Sends SGI `intid` (0..16) to vCPU `vcpu`: `svc #1` (ICC_SGI1R_EL1 is EL1-only).
pub fn send_sgi(vcpu: u32, intid: u32) {
    let value = (1u64 << (vcpu & 0xf))
        | (u64::from((vcpu >> 4) & 0xff) << 16)
        | (u64::from(intid & 0xf) << 24);
    // SAFETY: `svc #1` makes the EL1 stub write x0 to ICC_SGI1R_EL1 and return; nothing else
    // changes.
    unsafe { core::arch::asm!("svc #1", in("x0") value, options(nostack)) };
}

/// Sends SGI `intid` to this vCPU.
pub fn send_self_sgi(intid: u32) {
    send_sgi(super::percpu::vcpu_id(), intid);
}

/// The counter frequency (CNTFRQ_EL0, readable at EL0) in Hz.
pub fn counter_hz() -> u64 {
    let hz: u64;
    // SAFETY: reading CNTFRQ_EL0 has no side effects.
    unsafe { core::arch::asm!("mrs {}, cntfrq_el0", out(reg) hz, options(nomem, nostack)) };
    hz
}

/// Arms this vCPU's virtual timer (INTID 27) to fire once, `ticks` counter ticks from now
/// (CNTKCTL_EL1.EL0VTEN lets EL0 program it, as x86 CPL3 programs the user-mapped APIC).
pub fn arm_timer_ticks(ticks: u64) {
    let ticks = ticks.clamp(1, i32::MAX as u64);
    // SAFETY: CNTV_TVAL_EL0 and CNTV_CTL_EL0 only program this vCPU's virtual timer.
    unsafe {
        core::arch::asm!(
            "msr cntv_tval_el0, {t}",
            "msr cntv_ctl_el0, {on}",
            "isb",
            t = in(reg) ticks,
            on = in(reg) 1u64,
            options(nomem, nostack),
        )
    };
}

/// Stops this vCPU's virtual timer.
pub fn stop_timer() {
    // SAFETY: as `arm_timer_ticks`.
    unsafe { core::arch::asm!("msr cntv_ctl_el0, xzr", "isb", options(nomem, nostack)) };
}
