//! The runtime's events for the VMM's trace (`protocol::timeline`): which thread runs on which
//! vCPU, and what the runtime did with the contexts upcall records brought.
//!
//! Only when the VMM records a trace (`SHARED_FEATURE_TIMELINE`) does [`init`] allocate one
//! ring per vCPU and register them; otherwise every event site costs a load and a branch.
//! Events are written by scheduler code on the vCPU whose ring it is, with plain stores and no
//! exit; a full ring drops the event and counts it. A producer moved to another vCPU while it
//! writes (its activation taken and its scheduler adopted elsewhere, which is rare) may tear one
//! event; the VMM checks what it reads.

use core::alloc::Layout;
use core::sync::atomic::{AtomicU64, Ordering};

use activm_stub::hypercall;
use activm_stub::protocol::hypercall::Hypercall;
use activm_stub::protocol::shared::{SharedHeader, UpcallRecord, SHARED_FEATURE_TIMELINE};
use activm_stub::protocol::timeline::{
    record_arg, RecordAction, SwitchReason, TimelineEvent, TimelineKind, TimelineRing,
    TIMELINE_RING_CAPACITY,
};

use crate::arch::cpu;
use crate::percpu;
use crate::tcb::Tcb;

/// Address of vCPU 0's ring (the others follow); 0: no timeline.
static RINGS: AtomicU64 = AtomicU64::new(0);

/// vCPU 0, at boot: registers the rings if the VMM records a trace.
pub fn init() {
    let info = activm_stub::boot_info();
    if info.shared_area == 0 {
        return;
    }
    // SAFETY: the shared area's first page is the header, mapped for the guest's lifetime.
    let header = unsafe { &*(info.shared_area as *const SharedHeader) };
    if header.features & SHARED_FEATURE_TIMELINE == 0 {
        return;
    }
    let n = percpu::nr_vcpus() as usize;
    let Ok(layout) = Layout::array::<TimelineRing>(n) else {
        return;
    };
    // SAFETY: a non-zero size (n >= 1 vCPU); an all-zero ring is an empty one.
    let rings = unsafe { alloc::alloc::alloc_zeroed(layout) };
    if rings.is_null() {
        return;
    }
    // SAFETY: `rings` is n 64-byte aligned rings in guest RAM, leaked for the guest's lifetime.
    let r = unsafe {
        hypercall::raw(
            Hypercall::TimelineSetup as u64,
            rings as u64,
            n as u64,
            0,
            0,
        )
    };
    if r == 0 {
        RINGS.store(rings as u64, Ordering::Release);
    }
}

/// Thread `t` starts running here (scheduler context, just before the switch).
#[inline(always)]
pub fn switch_in(t: &Tcb) {
    if RINGS.load(Ordering::Relaxed) != 0 {
        push(TimelineKind::SwitchIn, 0, t.id.get(), 0);
    }
}

/// Thread `t` left this vCPU (scheduler context, right after the switch).
#[inline(always)]
pub fn switch_out(t: &Tcb, reason: SwitchReason) {
    if RINGS.load(Ordering::Relaxed) != 0 {
        push(TimelineKind::SwitchOut, 0, t.id.get(), reason as u64);
    }
}

/// Thread `t` is about to run for the first time: its name, in 8-byte chunks.
#[inline(always)]
pub fn first_run(t: &Tcb) {
    if RINGS.load(Ordering::Relaxed) != 0 {
        name(t);
    }
}

/// The runtime handled record `r`, whose context was thread `t` (if any), with `action`.
#[inline(always)]
pub fn record_handled(r: &UpcallRecord, t: Option<&Tcb>, action: RecordAction) {
    if RINGS.load(Ordering::Relaxed) != 0 {
        let thread = t.map_or(0, |t| t.id.get());
        push(
            TimelineKind::RecordHandled,
            r.vcpu,
            thread,
            record_arg(r.kind, action),
        );
    }
}

#[cold]
fn name(t: &Tcb) {
    let Some(name) = t.name() else {
        return;
    };
    for (i, chunk) in name.as_bytes().chunks(8).take(4).enumerate() {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        push(
            TimelineKind::ThreadName,
            8 * i as u32,
            t.id.get(),
            u64::from_le_bytes(bytes),
        );
    }
}

fn push(kind: TimelineKind, vcpu: u32, thread: u64, arg: u64) {
    let base = RINGS.load(Ordering::Acquire);
    let index = percpu::this().vcpu as usize;
    let ring = (base as usize + index * core::mem::size_of::<TimelineRing>()) as *mut TimelineRing;
    // SAFETY: `ring` is this vCPU's ring of the array `init` registered (index < nr_vcpus),
    // leaked for the guest's lifetime; its indices are atomics, read through shared references
    // to those fields only.
    let (head_ref, tail_ref, dropped) = unsafe { (&(*ring).head, &(*ring).tail, &(*ring).dropped) };
    let head = head_ref.load(Ordering::Relaxed);
    if head.wrapping_sub(tail_ref.load(Ordering::Acquire)) as usize >= TIMELINE_RING_CAPACITY {
        dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let event = TimelineEvent {
        tsc: cpu::rdtsc(),
        kind: kind as u32,
        vcpu,
        thread,
        arg,
    };
    let slot = head as usize % TIMELINE_RING_CAPACITY;
    // SAFETY: slot `head` is free (the VMM consumed up to `tail`, checked above) and only this
    // vCPU's code writes it; the pointer comes from the ring's own allocation.
    unsafe { core::ptr::addr_of_mut!((*ring).events[slot]).write(event) };
    head_ref.store(head.wrapping_add(1), Ordering::Release);
}
