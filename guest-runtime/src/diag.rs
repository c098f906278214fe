//! The runtime's self-description for the VMM's hang report (`protocol::diag`): built once at
//! start-up, its address published in the shared area's header. The VMM only reads it, and
//! only when it stops a guest that hangs.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::mem::{offset_of, size_of};

use activm_stub::protocol::diag::{self, RuntimeDiag, TcbLayout, VcpuDiag};
use activm_stub::protocol::MAX_VCPUS;

use crate::arch::cpu::{self, Word};
use crate::percpu;
use crate::tcb::{self, Tcb};

// The TCB's states and flags are the ones the protocol names.
const _: () = assert!(tcb::WAITING == diag::WAKE_WAITING);
const _: () = assert!(tcb::WOKEN == diag::WAKE_WOKEN);
const _: () = assert!(tcb::PARKED == diag::WAKE_PARKED);
const _: () = assert!(tcb::FLAG_MAIN == diag::TCB_FLAG_MAIN);
const _: () = assert!(tcb::FLAG_BLOCKED_IN_VMM == diag::TCB_FLAG_BLOCKED_IN_VMM);
const _: () = assert!(tcb::EV_NEXT as usize + 1 == diag::EVENT_NAMES.len());
const _: () = assert!(size_of::<Option<Arc<str>>>() == 2 * size_of::<u64>());

/// vCPU 0, at start-up (after `percpu::init`): build the table and publish its address.
pub(crate) fn publish() {
    let (halted, spinning, global_len) = crate::sched::diag_words();
    let mut vcpus = [VcpuDiag::default(); MAX_VCPUS];
    let nr = (percpu::nr_vcpus() as usize).min(MAX_VCPUS);
    for (v, out) in vcpus.iter_mut().enumerate().take(nr) {
        let word = |w: Word| cpu::word_of(v as u32, w) as *const _ as u64;
        let p = percpu::of(v as u32);
        *out = VcpuDiag {
            current: word(Word::Current),
            in_sched: word(Word::InSched),
            idle: word(Word::SchedIdle),
            timer: word(Word::Armed),
            runq_head: &p.head as *const _ as u64,
            runq_tail: &p.tail as *const _ as u64,
            runq_next: &p.next.0.ptr as *const _ as u64,
            _reserved: 0,
        };
    }
    let (name_ptr, name_len, name_delta) = name_layout().unwrap_or((0, 0, 0));
    let name = offset_of!(Tcb, name) as u32;
    let table = Box::leak(Box::new(RuntimeDiag {
        magic: diag::DIAG_MAGIC,
        size: size_of::<RuntimeDiag>() as u32,
        nr_vcpus: nr as u32,
        threads: tcb::all_head_address(),
        halted,
        spinning,
        global_len,
        tcb: TcbLayout {
            size: size_of::<Tcb>() as u32,
            next: offset_of!(Tcb, all_next) as u32,
            id: offset_of!(Tcb, id) as u32,
            refs: offset_of!(Tcb, refs) as u32,
            wake: offset_of!(Tcb, wake) as u32,
            event: offset_of!(Tcb, last_event) as u32,
            flags: offset_of!(Tcb, flags) as u32,
            sp: offset_of!(Tcb, sp) as u32,
            sleep: offset_of!(Tcb, sleep_deadline) as u32,
            name_ptr: if name_len == 0 { 0 } else { name + name_ptr },
            name_len: if name_len == 0 { 0 } else { name + name_len },
            name_delta,
        },
        vcpus,
    }));
    crate::activation::sa::publish_runtime_diag(table as *const RuntimeDiag as u64);
}

/// Where a thread's name (`Option<Arc<str>>`, two words) keeps the text's address and length:
/// the word offsets of the pointer and the length, and what to add to the pointer. Found by
/// looking at a known name, so a compiler that lays the pointer out otherwise gets no names
/// rather than wrong ones.
fn name_layout() -> Option<(u32, u32, u32)> {
    let probe: Option<Arc<str>> = Some(Arc::from("probe"));
    let text = probe.as_deref()?.as_ptr() as u64;
    // SAFETY: `Option<Arc<str>>` is two words (asserted above) of plain pointer-sized data;
    // copying its bytes out as integers reads no padding and takes no ownership.
    let words: [u64; 2] = unsafe { core::mem::transmute_copy(&probe) };
    (0..2).find_map(|i| {
        let (ptr, len) = (words[i], words[1 - i]);
        let delta = text.wrapping_sub(ptr);
        (len == 5 && ptr != 0 && delta < 64).then_some((
            8 * i as u32,
            8 * (1 - i) as u32,
            delta as u32,
        ))
    })
}
