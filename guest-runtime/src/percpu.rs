//! The runtime's per-vCPU structure ([`Pcpu`], Go's "P"): the run queue ring (owner pushes and
//! pops with restartable sequences, thieves take half with a CAS on `head`), a stack cache, a
//! TCB cache, and statistics. Its address is in the vCPU's `%gs` word `Word::Pcpu`.
//!
//! Discipline: code that can be preempted (thread code) or continued on another vCPU (scheduler
//! code handed over by the VMM) never keeps a `&Pcpu` across an instruction where that can
//! happen; it goes through [`this`] each time, or uses the restartable sequences, which read
//! `%gs` themselves.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use activm_stub::protocol::boot::BootInfo;

use crate::arch::cpu::{self, Word};
// The block, not the pool (`tcb.rs`), which takes from the caches here.
use crate::tcb::block::Tcb;

/// Entries of a vCPU's run queue ring (Go uses 256 too).
pub const RQ_CAP: usize = 256;

/// Adds one to a per-vCPU counter without a locked instruction (an interrupt racing with it on
/// the same vCPU may lose one count: these are statistics).
#[inline(always)]
pub fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// A cache line of its own.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Line<T>(pub T);

impl<T> core::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Scheduler events kept per vCPU for diagnostics.
pub const TRACE: usize = 512;

/// Trace event kinds.
pub const T_SWITCH_IN: u64 = 1;
pub const T_ADOPT_CTX: u64 = 2;
pub const T_ADOPT_SUSPENDED: u64 = 3;
pub const T_SUSPEND: u64 = 4;
pub const T_CONTINUE: u64 = 5;
pub const T_RESUME: u64 = 6;
pub const T_DROP_IDLE: u64 = 7;
pub const T_ACTIVATION: u64 = 8;
pub const T_RECORD: u64 = 9;
pub const T_ENTRY_CTX: u64 = 10;
pub const T_NESTED: u64 = 11;
pub const T_BAD_SP: u64 = 12;
pub const T_TAKE: u64 = 13;
pub const T_BUILD: u64 = 14;
pub const T_LATER: u64 = 15;
pub const T_RECINFO: u64 = 16;
#[cfg(feature = "sim")]
pub const T_SIM_SAW: u64 = 17;
pub const T_ARM: u64 = 18;
pub const T_TIMER: u64 = 19;
/// An interrupt whose frame is not on the current thread's stack (nested in a handler that
/// interrupted an activation entry).
pub const T_FOREIGN_STACK: u64 = 20;
/// A busy scheduler context queued for adoption by a nested drain (payload: its hold count
/// `<< 48` and its pc).
pub const T_ADOPT_QUEUED: u64 = 21;

/// Records a scheduler event (`kind`, a 56-bit payload) in this vCPU's trace ring.
/// Tracing stops for good once a diagnostics dump starts (the rings are printed as they were).
pub static TRACE_FROZEN: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

#[inline(always)]
pub fn trace(kind: u64, payload: u64) {
    if TRACE_FROZEN.load(Ordering::Relaxed) {
        return;
    }
    let p = this();
    // Per vCPU, diagnostics only: a plain increment (an interrupt racing with it may overwrite
    // one entry, nothing worse).
    let at = p.trace_at.load(Ordering::Relaxed);
    p.trace_at.store(at.wrapping_add(1), Ordering::Relaxed);
    let i = at as usize % TRACE;
    // Switch-ins are the hot path (a `rdtsc` costs ~15 ns of a ~90 ns yield here): they are
    // printed with the time of the event before them.
    let tsc = if kind == T_SWITCH_IN {
        0
    } else {
        activm_stub::rdtsc()
    };
    p.trace_tsc[i].store(tsc, Ordering::Relaxed);
    p.trace[i].store(
        (kind << 56) | (payload & ((1 << 56) - 1)),
        Ordering::Relaxed,
    );
}

/// Prints every vCPU's trace ring, oldest first (diagnostics).
pub fn print_trace() {
    print_trace_last(TRACE);
}

/// Prints the last `n` entries of every vCPU's trace ring.
pub fn print_trace_last(n: usize) {
    TRACE_FROZEN.store(true, Ordering::Release);
    for p in pcpus() {
        let at = p.trace_at.load(Ordering::Relaxed) as usize;
        let mut last_tsc = 0;
        for i in TRACE - n.min(TRACE)..TRACE {
            let e = p.trace[(at + i) % TRACE].load(Ordering::Relaxed);
            let tsc = match p.trace_tsc[(at + i) % TRACE].load(Ordering::Relaxed) {
                0 => last_tsc,
                t => t,
            };
            last_tsc = tsc;
            if e != 0 {
                activm_stub::println!(
                    "activm-rt: TSC {} vCPU {} trace {:>2}: kind {} payload {:#x}",
                    tsc,
                    p.vcpu,
                    i,
                    e >> 56,
                    e & ((1 << 56) - 1)
                );
            }
        }
    }
}

/// Prints every vCPU's trace entries whose payload is `value`, each with the one after it
/// (diagnostics: what happened to one thread).
pub fn print_trace_about(value: u64) {
    TRACE_FROZEN.store(true, Ordering::Release);
    for p in pcpus() {
        let at = p.trace_at.load(Ordering::Relaxed) as usize;
        let mut show_next = false;
        for i in 0..TRACE {
            let e = p.trace[(at + i) % TRACE].load(Ordering::Relaxed);
            let tsc = p.trace_tsc[(at + i) % TRACE].load(Ordering::Relaxed);
            let hit = e != 0 && e & ((1 << 56) - 1) == value & ((1 << 56) - 1);
            if hit || show_next {
                activm_stub::println!(
                    "activm-rt: TSC {} vCPU {} trace {:>3}: kind {} payload {:#x}",
                    tsc,
                    p.vcpu,
                    i,
                    e >> 56,
                    e & ((1 << 56) - 1)
                );
            }
            show_next = hit;
        }
    }
}

/// Stacks kept per vCPU before they go back to the global pool.
pub const STACK_CACHE: usize = 16;
/// TCBs kept per vCPU before they go back to the global pool.
pub const TCB_CACHE: usize = 32;
/// An empty entry of `Pcpu::stacks`.
pub const NO_SLOT: u32 = u32::MAX;

/// Counters, per vCPU (summed by [`crate::stats`]).
#[derive(Debug, Default)]
pub struct Counters {
    pub switches: AtomicU64,
    pub preemptions: AtomicU64,
    pub timer_irqs: AtomicU64,
    pub deferred_held: AtomicU64,
    pub deferred_sched: AtomicU64,
    pub rseq_rewinds: AtomicU64,
    pub steals: AtomicU64,
    pub halts: AtomicU64,
    /// Processors given back idle (`sa_yield`).
    pub idle_yields: AtomicU64,
    pub ipis_sent: AtomicU64,
    /// Wake-ups from a thread that left the woken thread to this vCPU instead of interrupting
    /// a halted one (`sched::wakeup`: this vCPU's turns are short).
    pub wakes_kept: AtomicU64,
    pub upcalls: AtomicU64,
    pub records: AtomicU64,
    pub continuations: AtomicU64,
    pub adoptions: AtomicU64,
    pub dropped_idle_contexts: AtomicU64,
    /// Contexts from records taken while a CPU-exception handler ran (`exception_stack::handler_context`).
    pub exception_contexts: AtomicU64,
    pub resumed_contexts: AtomicU64,
    pub activations: AtomicU64,
    /// `Word::Armed` found holding a deadline long past (`timer::armed_deadline`).
    pub stale_timer_words: AtomicU64,
}

/// A vCPU's `next` thread (see `Pcpu::next`).
#[derive(Debug)]
pub struct NextSlot {
    pub ptr: AtomicPtr<Tcb>,
    /// Bumped by the owner each time it fills `ptr`: an idle vCPU that sees the same thread and
    /// count twice knows the thread stayed there (TCBs are recycled, so the pointer alone could
    /// be a new thread at the same address).
    pub seq: AtomicU64,
}

/// One vCPU's runtime state.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Pcpu {
    /// Run queue producer index (written by the owner only).
    pub tail: AtomicU32,
    _pad0: [u8; 60],
    /// Run queue consumer index (owner and thieves, by CAS).
    pub head: AtomicU32,
    _pad1: [u8; 60],
    /// The thread to run next here (Go's `runnext`), on a line of its own: one the running
    /// thread just spawned or woke, so it runs when that thread blocks (a hand-off, usually at
    /// once) instead of crossing to another vCPU. Taken by this vCPU's scheduler first (or by a
    /// joiner here); other vCPUs take it only after it stayed there for `sched::queue::NEXT_GRACE_NS`.
    pub next: Line<NextSlot>,
    pub ring: [AtomicPtr<Tcb>; RQ_CAP],
    /// The counter `rseq::probe_increment` adds to (tests).
    pub probe: Line<AtomicU64>,
    pub vcpu: u32,
    pub apic_id: u32,
    /// Scheduler ticks, to look at the global queue now and then (Go: every 61).
    pub tick: AtomicU64,
    /// xorshift state for victim selection and test randomness.
    pub rng: AtomicU64,
    /// When the current time slice began (TSC): a thread run from `next` inherits it (Go's
    /// `inheritTime`), so hand-off chains cannot keep the ring's threads waiting beyond a slice.
    pub slice_start: AtomicU64,
    /// Idle scheduler: another vCPU's `next` thread seen there (vCPU, thread, since when); it
    /// may be taken once it stayed longer than the grace period.
    pub seen_next_vcpu: AtomicU32,
    pub seen_next: AtomicPtr<Tcb>,
    pub seen_next_at: AtomicU64,
    pub seen_next_seq: AtomicU64,
    /// Set by the idle loop when the thread in `seen_next` may be taken.
    pub steal_next: AtomicU32,
    /// Stack cache (slot indices; `NO_SLOT`: empty entry). Each entry is taken and filled by
    /// one atomic operation (`stack.rs`): code the VMM took away here may go on elsewhere with
    /// this `Pcpu` while this vCPU's next activation uses it too.
    pub stacks: [AtomicU32; STACK_CACHE],
    /// TCB cache (null: empty entry), used the same way (`tcb.rs`).
    pub tcbs: [AtomicPtr<Tcb>; TCB_CACHE],
    /// Set while this vCPU's scheduler drains its upcall queue.
    pub in_drain: AtomicU32,
    /// Top of this vCPU's alternate exception stack (to re-arm it after a retried `#UD`).
    pub exception_stack: AtomicU64,
    /// Timer interrupts deferred in a row (`dispatch::points::on_timer`): random preemption re-arms only
    /// the first few, so nested deferrals cannot pile up frames on the interrupted stack.
    pub timer_deferrals: AtomicU32,
    /// Diagnostics: the last scheduler events (`trace`), printed on a fatal exception.
    pub trace: [AtomicU64; TRACE],
    pub trace_tsc: [AtomicU64; TRACE],
    pub trace_at: AtomicU32,
    pub counters: Counters,
    /// When this vCPU's current turn began (TSC; 0: it idled since), and a moving average of
    /// its turns' lengths (ticks): see `sched::wakeup`.
    pub turn_from: AtomicU64,
    pub turn_avg: AtomicU64,
    /// When another vCPU sent this one a reschedule IPI to end its halt (TSC; 0: none).
    pub woken_at: AtomicU64,
}

impl Pcpu {
    pub fn new(vcpu: u32, apic_id: u32) -> Pcpu {
        Pcpu {
            tail: AtomicU32::new(0),
            _pad0: [0; 60],
            head: AtomicU32::new(0),
            _pad1: [0; 60],
            next: Line(NextSlot {
                ptr: AtomicPtr::new(core::ptr::null_mut()),
                seq: AtomicU64::new(0),
            }),
            ring: [const { AtomicPtr::new(core::ptr::null_mut()) }; RQ_CAP],
            probe: Line(AtomicU64::new(0)),
            vcpu,
            apic_id,
            tick: AtomicU64::new(0),
            rng: AtomicU64::new(
                0x9E37_79B9_7F4A_7C15 ^ (u64::from(vcpu) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
            slice_start: AtomicU64::new(0),
            seen_next_vcpu: AtomicU32::new(0),
            seen_next: AtomicPtr::new(core::ptr::null_mut()),
            seen_next_at: AtomicU64::new(0),
            seen_next_seq: AtomicU64::new(0),
            steal_next: AtomicU32::new(0),
            stacks: [const { AtomicU32::new(NO_SLOT) }; STACK_CACHE],
            tcbs: [const { AtomicPtr::new(core::ptr::null_mut()) }; TCB_CACHE],
            in_drain: AtomicU32::new(0),
            exception_stack: AtomicU64::new(0),
            timer_deferrals: AtomicU32::new(0),
            trace: [const { AtomicU64::new(0) }; TRACE],
            trace_tsc: [const { AtomicU64::new(0) }; TRACE],
            trace_at: AtomicU32::new(0),
            counters: Counters::default(),
            turn_from: AtomicU64::new(0),
            turn_avg: AtomicU64::new(0),
            woken_at: AtomicU64::new(0),
        }
    }

    /// Threads in the ring (a snapshot; exact only for the owner with no thief around).
    pub fn len(&self) -> u32 {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(RQ_CAP as u32)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes half of this ring's threads (at least one) into `out`, for another vCPU (Go's
    /// `runqgrab`); returns how many.
    pub fn steal_half(&self, out: &mut [*const Tcb; RQ_CAP / 2]) -> usize {
        let mut spins = 0u32;
        loop {
            let head = self.head.load(Ordering::Acquire);
            let tail = self.tail.load(Ordering::Acquire);
            let available = tail.wrapping_sub(head);
            if available == 0 {
                return 0;
            }
            if available as usize > RQ_CAP {
                // Read head and tail at different times; try again.
                spins += 1;
                if spins == 1 << 20 {
                    panic!(
                        "the run queue of vCPU {} is corrupt: head {head}, tail {tail}",
                        self.vcpu
                    );
                }
                core::hint::spin_loop();
                continue;
            }
            let n = (available - available / 2) as usize;
            let n = n.min(RQ_CAP / 2);
            for (i, slot) in out.iter_mut().enumerate().take(n) {
                let at = head.wrapping_add(i as u32) as usize & (RQ_CAP - 1);
                *slot = self.ring[at].load(Ordering::Relaxed);
            }
            if self
                .head
                .compare_exchange(
                    head,
                    head.wrapping_add(n as u32),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return n;
            }
        }
    }

    /// A pseudo-random number (xorshift64*), for victim choice and tests.
    pub fn random(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// This vCPU's `Pcpu`. See the module documentation for when the reference may be kept.
#[inline(always)]
pub fn this() -> &'static Pcpu {
    // SAFETY: `Word::Pcpu` is set, before the scheduler or any thread runs on this vCPU, to a
    // `Pcpu` leaked for the guest's lifetime.
    unsafe { &*(cpu::get(Word::Pcpu) as *const Pcpu) }
}

/// vCPU `vcpu`'s `Pcpu`.
pub fn of(vcpu: u32) -> &'static Pcpu {
    pcpus()[vcpu as usize]
}

static NR_VCPUS: AtomicU32 = AtomicU32::new(1);
static TSC_KHZ: AtomicU64 = AtomicU64::new(1_000_000);
static PCPUS: AtomicPtr<&'static Pcpu> = AtomicPtr::new(core::ptr::null_mut());

/// vCPU 0, at boot, before any other vCPU uses the runtime: the vCPU count, the TSC rate and
/// every vCPU's `Pcpu`.
pub fn init(info: &BootInfo) {
    NR_VCPUS.store(info.nr_vcpus.max(1), Ordering::Relaxed);
    TSC_KHZ.store(info.tsc_khz.max(1), Ordering::Relaxed);
    let pcpus: Vec<&'static Pcpu> = (0..info.nr_vcpus)
        .map(|v| &*Box::leak(Box::new(Pcpu::new(v, info.vcpus[v as usize].irq_id))))
        .collect();
    PCPUS.store(pcpus.leak().as_mut_ptr(), Ordering::Release);
}

/// Number of vCPUs.
#[inline]
pub fn nr_vcpus() -> u32 {
    NR_VCPUS.load(Ordering::Relaxed)
}

/// Whether this guest has one vCPU, for its whole life (the count is fixed at boot, and 1
/// before `init` while only vCPU 0 runs): no other processor can touch a word concurrently.
#[inline(always)]
pub fn one_vcpu() -> bool {
    nr_vcpus() == 1
}

/// TSC frequency.
#[inline]
pub fn tsc_khz() -> u64 {
    TSC_KHZ.load(Ordering::Relaxed)
}

/// Every vCPU's `Pcpu`, by index.
pub fn pcpus() -> &'static [&'static Pcpu] {
    let p = PCPUS.load(Ordering::Acquire);
    // SAFETY: vCPU 0 leaks this slice of `nr_vcpus` entries (`init`) before any other vCPU
    // uses the runtime.
    unsafe { core::slice::from_raw_parts(p, nr_vcpus() as usize) }
}

/// TSC ticks in `ns` nanoseconds.
pub fn ns_to_ticks(ns: u64) -> u64 {
    (u128::from(ns) * u128::from(tsc_khz()) / 1_000_000) as u64
}

/// Nanoseconds in `ticks` TSC ticks.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    (u128::from(ticks) * 1_000_000 / u128::from(tsc_khz().max(1))) as u64
}
