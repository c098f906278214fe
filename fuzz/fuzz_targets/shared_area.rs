//! The shared area as the VMM reads it: upcall queue indices, the stack pool and records that a
//! hostile guest rewrites between any two VMM operations. The VMM's operations (start, end,
//! yield and cancel activations, post and flush events) must neither panic nor write outside
//! the shared area, and every stack it takes must be a plausible one.

#![no_main]

use std::mem::offset_of;

use activm::activation::{Activations, Event, NewActivation, SharedArea, MAX_PENDING};
use activm_fuzz::{Guest, Input};
use libfuzzer_sys::fuzz_target;
use protocol::shared::{
    vcpu_area_offset, SharedHeader, UpcallKind, VcpuArea, VcpuRunState, STACK_POOL_CAPACITY,
};

/// Offsets (from the area's start) of the fields a guest writes, for `vcpus` vCPUs.
fn guest_fields(vcpus: u32) -> Vec<u64> {
    let mut fields = vec![
        offset_of!(SharedHeader, stack_prod) as u64,
        offset_of!(SharedHeader, idle_vcpus) as u64,
    ];
    for slot in 0..STACK_POOL_CAPACITY {
        fields.push((offset_of!(SharedHeader, stacks) + 8 * slot) as u64);
    }
    for vcpu in 0..vcpus as usize {
        let area = vcpu_area_offset(vcpu);
        fields.push((area + offset_of!(VcpuArea, queue_tail)) as u64);
        fields.push((area + offset_of!(VcpuArea, defer_preemption)) as u64);
        fields.push((area + offset_of!(VcpuArea, records)) as u64);
    }
    fields
}

fn zero_page(guest: &Guest, at: u64) -> bool {
    guest
        .ram
        .read_bytes(at, 4096)
        .unwrap()
        .iter()
        .all(|&b| b == 0)
}

fuzz_target!(|data: &[u8]| {
    thread_local! {
        static GUESTS: Vec<Guest> = (1..=4).map(Guest::new).collect();
    }
    let mut input = Input(data);
    let vcpus = 1 + input.u8() as u32 % 4;
    GUESTS.with(|guests| {
        let guest = &guests[vcpus as usize - 1];
        let plan = &guest.plan;
        let shared = plan.shared_area.clone();
        let zeros = vec![0u8; (shared.end - shared.start) as usize];
        guest.ram.write_bytes(shared.start, &zeros).unwrap();
        let area = SharedArea::new(&guest.ram, plan);
        let fields = guest_fields(vcpus);
        let acts = Activations::new(vcpus, true);
        acts.register(plan.image.start);
        acts.enable().unwrap();
        let mut started: Vec<Option<NewActivation>> = vec![None; vcpus as usize];
        while !input.is_empty() {
            let vcpu = input.u8() as u32 % vcpus;
            match input.u8() % 10 {
                0 | 1 => {
                    // The guest writes a field (or anywhere in the area).
                    let at = match input.u8() % 4 {
                        0 => input.u32() as u64 % (shared.end - shared.start - 8),
                        _ => fields[input.u8() as usize % fields.len()],
                    };
                    let value = input.number();
                    guest.ram.write_u64(shared.start + at, value).unwrap();
                }
                2 => {
                    if let Ok(start) = acts.start_activation(area, vcpu) {
                        let top = start.stack_top;
                        assert!(
                            top % 16 == 0 && top >= plan.image.start + 64 && top <= plan.mem_size
                        );
                        started[vcpu as usize] = Some(start);
                    }
                }
                3 => {
                    let why = match input.u8() % 3 {
                        0 => VcpuRunState::Preempted,
                        1 => VcpuRunState::Blocked,
                        _ => VcpuRunState::Stopped,
                    };
                    acts.end_activation(area, vcpu, why);
                }
                4 => acts.yield_activation(area, vcpu),
                5 => {
                    if let Some(start) = started[vcpu as usize].take() {
                        acts.cancel_activation(area, vcpu, start);
                    }
                }
                6 | 7 => {
                    let kind = UpcallKind::from_raw(1 + input.u8() as u32 % 6).unwrap();
                    let mut event = Event::new(kind, input.u32(), vcpu, input.u64());
                    if input.u8() & 1 == 1 {
                        event.context = Some(Box::default());
                    }
                    let target = (input.u8() & 1 == 1).then_some(input.u8() as u32 % vcpus);
                    let _ = acts.post(area, event, target);
                    assert!(acts.pending() <= MAX_PENDING + 1);
                }
                8 => {
                    let _ = acts.flush_pending(area, vcpu);
                }
                _ => {
                    let _ = acts.describe(area);
                    let _ = acts.blocked_record_queue(input.u32());
                    let _ = area.defer_requested(vcpu);
                    let _ = area.idle_vcpus();
                }
            }
        }
        // Nothing the VMM wrote lies outside the shared area.
        assert!(zero_page(guest, shared.start - 4096));
        assert!(zero_page(guest, (shared.end + 4095) & !4095));
    });
});
