//! The VMM's one view of a guest's shared area (`protocol::shared`): the header with the stack
//! pool and the idle mask, and one `VcpuArea` per vCPU with its run state and upcall queue.
//! Every field the VMM reads or writes is named here, once; everything it reads is untrusted.

use std::mem::offset_of;

use protocol::shared::{SharedHeader, UpcallRecord, VcpuArea, VcpuRunState};

use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// A guest's shared area: its RAM and the plan that says where the area lies.
#[derive(Clone, Copy, Debug)]
pub struct SharedArea<'a> {
    ram: &'a GuestRam,
    plan: &'a Plan,
}

impl<'a> SharedArea<'a> {
    pub fn new(ram: &'a GuestRam, plan: &'a Plan) -> SharedArea<'a> {
        SharedArea { ram, plan }
    }

    pub fn plan(&self) -> &'a Plan {
        self.plan
    }

    fn vcpu_field(&self, vcpu: u32, offset: usize) -> u64 {
        self.plan.vcpu_area(vcpu) + offset as u64
    }

    fn header_field(&self, offset: usize) -> u64 {
        self.plan.shared_area.start + offset as u64
    }

    fn read_u32(&self, at: u64) -> Result<u32, Error> {
        self.ram
            .read_bytes(at, 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    /// Whether the guest asks to defer a preemption of `vcpu` (`VcpuArea::defer_preemption`).
    pub fn defer_requested(&self, vcpu: u32) -> bool {
        self.read_u32(self.vcpu_field(vcpu, offset_of!(VcpuArea, defer_preemption)))
            .map(|v| v != 0)
            .unwrap_or(false)
    }

    /// Tell the guest the VMM wants `vcpu`'s processor back (`VcpuArea::preempt_pending`).
    pub fn set_preempt_pending(&self, vcpu: u32, pending: bool) {
        let at = self.vcpu_field(vcpu, offset_of!(VcpuArea, preempt_pending));
        let _ = self.ram.write_u32(at, pending as u32);
    }

    /// `VcpuArea::state` and `VcpuArea::activation` of `vcpu`.
    pub fn set_run_state(&self, vcpu: u32, state: VcpuRunState, activation: u32) {
        let _ = self.ram.write_u32(
            self.vcpu_field(vcpu, offset_of!(VcpuArea, activation)),
            activation,
        );
        let _ = self.ram.write_u32(
            self.vcpu_field(vcpu, offset_of!(VcpuArea, state)),
            state as u32,
        );
    }

    /// The guest's consumer index of `vcpu`'s upcall queue (any value: the guest writes it).
    pub fn queue_tail(&self, vcpu: u32) -> Result<u32, Error> {
        self.read_u32(self.vcpu_field(vcpu, offset_of!(VcpuArea, queue_tail)))
    }

    /// Publish the producer index of `vcpu`'s upcall queue.
    pub fn set_queue_head(&self, vcpu: u32, head: u32) -> Result<(), Error> {
        let at = self.vcpu_field(vcpu, offset_of!(VcpuArea, queue_head));
        self.ram.write_u32(at, head)
    }

    /// Guest-physical address of record slot `slot` of `vcpu`'s queue.
    fn record_addr(&self, vcpu: u32, slot: usize) -> u64 {
        self.vcpu_field(vcpu, offset_of!(VcpuArea, records))
            + (slot * std::mem::size_of::<UpcallRecord>()) as u64
    }

    pub fn write_record(&self, vcpu: u32, slot: usize, record: &UpcallRecord) -> Result<(), Error> {
        self.ram.write_struct(self.record_addr(vcpu, slot), record)
    }

    /// Read back a record slot as integers (any bytes are valid), to take it back.
    pub fn read_record<T: Copy + Default>(&self, vcpu: u32, slot: usize) -> Result<T, Error> {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<UpcallRecord>()) };
        self.ram.read_struct(self.record_addr(vcpu, slot))
    }

    /// The address of the guest runtime's self-description (`protocol::diag`; 0: none).
    pub fn runtime_diag(&self) -> u64 {
        self.ram
            .read_u64(self.header_field(offset_of!(SharedHeader, runtime_diag)))
            .unwrap_or(0)
    }

    /// The guest's producer index of the upcall stack pool.
    pub fn stack_prod(&self) -> Result<u32, Error> {
        self.read_u32(self.header_field(offset_of!(SharedHeader, stack_prod)))
    }

    /// The stack top in pool slot `slot` (any value: the guest writes it).
    pub fn stack(&self, slot: usize) -> Result<u64, Error> {
        let at = self.header_field(offset_of!(SharedHeader, stacks)) + 8 * slot as u64;
        self.ram.read_u64(at)
    }

    /// Publish the consumer index of the upcall stack pool.
    pub fn set_stack_cons(&self, cons: u32) -> Result<(), Error> {
        let at = self.header_field(offset_of!(SharedHeader, stack_cons));
        self.ram.write_u32(at, cons)
    }

    /// `SharedHeader::idle_vcpus`: bit `i` set means the guest marks vCPU `i` idle.
    pub fn idle_vcpus(&self) -> u64 {
        self.ram
            .read_u64(self.header_field(offset_of!(SharedHeader, idle_vcpus)))
            .unwrap_or(0)
    }

    /// `SharedHeader::earliest_sleeper`: the TSC deadline of the guest's earliest sleeping
    /// thread (`u64::MAX`: none), or `None` if the guest does not publish it (0).
    pub fn earliest_sleeper(&self) -> Option<u64> {
        self.ram
            .read_u64(self.header_field(offset_of!(SharedHeader, earliest_sleeper)))
            .ok()
            .filter(|&tsc| tsc != 0)
    }

    /// `vcpu`'s queue tail for reports (`u32::MAX`: unreadable).
    pub fn queue_tail_or_max(&self, vcpu: u32) -> u32 {
        self.queue_tail(vcpu).unwrap_or(u32::MAX)
    }
}
