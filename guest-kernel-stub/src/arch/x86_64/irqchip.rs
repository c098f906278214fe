//! The interrupt controller: the local APIC in xAPIC mode, driven from CPL3: the VMM maps its page with the U bit and the
//! in-kernel LAPIC handles the accesses without an exit to the VMM.

use protocol::arch::x86_64::{LAPIC_BASE, VECTOR_SPURIOUS};

/// Local APIC ID register.
const REG_ID: u64 = 0x20;
/// End-of-interrupt register.
pub(crate) const REG_EOI: u64 = 0xB0;
/// In-service register: eight 32-bit words, 16 bytes apart.
const REG_ISR: u64 = 0x100;
/// Interrupt request register: eight 32-bit words, 16 bytes apart.
const REG_IRR: u64 = 0x200;
/// Spurious-interrupt vector register; bit 8 software-enables the APIC.
const REG_SVR: u64 = 0xF0;
/// Interrupt command register, low half (writing it sends the IPI) and high half (destination).
const REG_ICR_LOW: u64 = 0x300;
const REG_ICR_HIGH: u64 = 0x310;
/// Timer: local vector table entry, initial count, divide configuration.
const REG_LVT_TIMER: u64 = 0x320;
const REG_TIMER_INITIAL: u64 = 0x380;
const REG_TIMER_CURRENT: u64 = 0x390;
const REG_TIMER_DIVIDE: u64 = 0x3E0;

const SVR_ENABLE: u32 = 1 << 8;
/// ICR destination shorthand "self" (bits 18-19 = 0b01).
const ICR_SELF: u32 = 0b01 << 18;
const LVT_MASKED: u32 = 1 << 16;
const LVT_TIMER_PERIODIC: u32 = 1 << 17;
/// Divide configuration "divide by 1".
const TIMER_DIVIDE_1: u32 = 0b1011;

#[inline(always)]
fn write(reg: u64, value: u32) {
    // SAFETY: the VMM maps the LAPIC page at LAPIC_BASE for CPL3; `reg` is a valid register.
    unsafe { core::ptr::write_volatile((LAPIC_BASE + reg) as *mut u32, value) }
}

#[inline(always)]
fn read(reg: u64) -> u32 {
    // SAFETY: as in `write`.
    unsafe { core::ptr::read_volatile((LAPIC_BASE + reg) as *const u32) }
}

/// Software-enables this vCPU's APIC with spurious vector `VECTOR_SPURIOUS`.
pub fn enable() {
    write(REG_SVR, SVR_ENABLE | u32::from(VECTOR_SPURIOUS));
}

/// Signals end of interrupt for the highest-priority in-service vector.
#[inline(always)]
pub fn eoi() {
    write(REG_EOI, 0);
}

/// Sends EOIs until no vector of `vectors` is in service on this vCPU's APIC (reading the
/// in-service words they are in; ~6.5 us per access). A new activation calls it: the vCPU's
/// previous activation may have been taken away between an interrupt's delivery and its EOI,
/// which then went to another vCPU's APIC (see `traps::trap_eoi_window`). Returns how many EOIs
/// it sent.
pub fn clear_in_service(vectors: &[u8]) -> u32 {
    // One mask per in-service word, so each word is read once per pass (0x30/0x31 share one).
    let mut masks = [0u32; 8];
    for &v in vectors {
        masks[usize::from(v / 32)] |= 1 << (v % 32);
    }
    let mut sent = 0;
    // At most one EOI per vector class; each clears the highest in-service vector.
    for _ in 0..16 {
        let stale = masks
            .iter()
            .enumerate()
            .any(|(word, &mask)| mask != 0 && read(REG_ISR + 16 * word as u64) & mask != 0);
        if !stale {
            break;
        }
        eoi();
        sent += 1;
    }
    sent
}

/// Diagnostics: this vCPU's in-service and request bits for `vector` (two APIC reads).
pub fn vector_state(vector: u8) -> (bool, bool) {
    let word = 16 * u64::from(vector / 32);
    let bit = 1 << (vector % 32);
    (
        read(REG_ISR + word) & bit != 0,
        read(REG_IRR + word) & bit != 0,
    )
}

/// This vCPU's APIC ID.
pub fn id() -> u32 {
    read(REG_ID) >> 24
}

/// Sends `vector` to this vCPU (fixed delivery, self shorthand).
pub fn send_self_ipi(vector: u8) {
    write(REG_ICR_LOW, u32::from(vector) | ICR_SELF);
}

/// Sends `vector` to the vCPU with APIC ID `apic_id` (fixed delivery, physical destination).
/// Two register writes: an interrupt handler that sends an IPI between them would retarget this
/// one, so do not send IPIs from interrupt handlers and normal code on the same vCPU at once.
pub fn send_ipi(apic_id: u32, vector: u8) {
    write(REG_ICR_HIGH, apic_id << 24);
    write(REG_ICR_LOW, u32::from(vector));
}

/// Starts this vCPU's APIC timer in periodic mode: `vector` every `count` timer ticks (divide by
/// 1; KVM's in-kernel APIC ticks at 1 GHz, and clamps periods below ~200 us on our hosts).
pub fn start_periodic_timer(vector: u8, count: u32) {
    write(REG_TIMER_DIVIDE, TIMER_DIVIDE_1);
    write(REG_LVT_TIMER, u32::from(vector) | LVT_TIMER_PERIODIC);
    write(REG_TIMER_INITIAL, count);
}

/// Programs this vCPU's APIC timer for one-shot mode on `vector` (divide by 1), stopped. Arm it
/// with [`set_timer_count`]. Each APIC access costs an exit into KVM (~6.5 us on our hosts), so
/// the runtime programs the mode once and then only writes the count.
pub fn setup_oneshot_timer(vector: u8) {
    write(REG_TIMER_INITIAL, 0);
    write(REG_TIMER_DIVIDE, TIMER_DIVIDE_1);
    write(REG_LVT_TIMER, u32::from(vector));
}

/// (Re)starts the one-shot timer: it fires once after `count` ticks (KVM: 1 tick = 1 ns);
/// 0 stops it.
#[inline]
pub fn set_timer_count(count: u32) {
    write(REG_TIMER_INITIAL, count);
}

/// Ticks left before the timer fires (0: not running).
pub fn timer_count() -> u32 {
    read(REG_TIMER_CURRENT)
}

/// Stops and masks this vCPU's APIC timer.
pub fn stop_timer() {
    write(REG_TIMER_INITIAL, 0);
    write(REG_LVT_TIMER, LVT_MASKED);
}
