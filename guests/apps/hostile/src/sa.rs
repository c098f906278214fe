//! The scheduler-activation modes: bad calls, bad entries and stacks, corrupt indices and
//! records, a guest that never consumes its upcalls. Run with `--vcpus 2`.

use alloc::vec;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

#[cfg(target_arch = "aarch64")]
use activm_stub::protocol::arch::aarch64::{IMAGE_BASE, UPCALL_IRQ};
#[cfg(target_arch = "x86_64")]
use activm_stub::protocol::arch::x86_64::LAPIC_BASE;
#[cfg(target_arch = "x86_64")]
use activm_stub::protocol::arch::x86_64::{IMAGE_BASE, UPCALL_IRQ};
use activm_stub::protocol::hypercall::{Hypercall, HC_UNSUPPORTED};
use activm_stub::protocol::shared::{
    SharedHeader, VcpuArea, STACK_POOL_CAPACITY, UPCALL_QUEUE_CAPACITY,
};
use activm_stub::{boot_info, exit, nr_vcpus, pause, println, rdtsc, tsc_khz, IrqFrame};

use crate::{raw, refused, stopped};

/// The runner of an activation mode, if `mode` is one.
pub fn mode(mode: &str) -> Option<fn(u32) -> !> {
    Some(match mode {
        "sa-register-outside-image" => |_| {
            stopped(
                "sa-register-outside-image",
                raw(Hypercall::SaRegister, 0x1000, 0, 0),
            )
        },
        "sa-enable-unregistered" => {
            |_| stopped("sa-enable-unregistered", raw(Hypercall::SaEnable, 0, 0, 0))
        }
        "sa-before-enable" => |vcpu| only_vcpu0(vcpu, before_enable),
        "concurrency-zero" => |_| {
            stopped(
                "concurrency-zero",
                raw(Hypercall::SaSetConcurrency, 0, 0, 0),
            )
        },
        "concurrency-max" => |_| {
            stopped(
                "concurrency-max",
                raw(Hypercall::SaSetConcurrency, u32::MAX.into(), 0, 0),
            )
        },
        "preempt-nonexistent" => |vcpu| only_vcpu0(vcpu, preempt_nonexistent),
        "queue-indices-huge" => queue_indices_huge,
        "never-consumes" => never_consumes,
        "consumes-late" => consumes_late,
        "entry-garbage" => |vcpu| bad_pool(vcpu, "entry-garbage", IMAGE_BASE, &[]),
        "stack-unaligned" => |vcpu| bad_pool(vcpu, "stack-unaligned", 0, &[Some(8)]),
        "stack-outside-ram" => |vcpu| bad_pool(vcpu, "stack-outside-ram", 0, &[Some(u64::MAX)]),
        "stack-in-vmm-pages" => |vcpu| bad_pool(vcpu, "stack-in-vmm-pages", 0, &[None]),
        "stack-pool-exhausted" => |vcpu| bad_pool(vcpu, "stack-pool-exhausted", 0, &[]),
        "stack-indices-corrupt" => stack_indices_corrupt,
        "corrupt-records" => corrupt_records,
        _ => return None,
    })
}

fn only_vcpu0(vcpu: u32, run: fn() -> !) -> ! {
    if vcpu != 0 {
        activm_stub::vcpu_stop()
    }
    run()
}

/// This vCPU's index, from its local APIC id (the protocol makes them equal). Not the stub's
/// `vcpu_id`: its per-vCPU block is filled by the boot code at CPL3, and a vCPU whose boot
/// context was preempted before that (and dropped, as these modes drop contexts) never fills
/// it, so its new activations would read vCPU 0's index there.
#[cfg(target_arch = "x86_64")]
fn this_vcpu() -> u32 {
    // SAFETY: the local APIC's ID register (offset 0x20), mapped user-readable by the VMM.
    unsafe { ((LAPIC_BASE + 0x20) as *const u32).read_volatile() >> 24 }
}

/// This vCPU's index, from where TPIDRRO_EL0 points (set at EL1 before any EL0 code), for the
/// same reason.
#[cfg(target_arch = "aarch64")]
fn this_vcpu() -> u32 {
    activm_stub::arch::aarch64::percpu::vcpu_index_of_register()
}

fn header() -> &'static SharedHeader {
    // SAFETY: the shared area's first page is the header; the guest owns its fields.
    unsafe { &*(boot_info().shared_area as *const SharedHeader) }
}

fn area(vcpu: u32) -> &'static VcpuArea {
    // SAFETY: vCPU `vcpu`'s part of the shared area (protocol layout).
    unsafe { &*((boot_info().shared_area + 4096 + u64::from(vcpu) * 16384) as *const VcpuArea) }
}

/// The raw pool: stack tops are written straight into `stacks` (the guest is its producer).
fn push_top(top: u64) {
    let header = header();
    let prod = header.stack_prod.0.load(Ordering::Relaxed);
    let slot = &header.stacks[prod as usize % STACK_POOL_CAPACITY] as *const u64 as *mut u64;
    // SAFETY: the guest writes pool entries; the VMM reads them only after `stack_prod` moves.
    unsafe { slot.write_volatile(top) };
    header
        .stack_prod
        .0
        .store(prod.wrapping_add(1), Ordering::Release);
}

/// The top of a fresh 16 KiB stack from the heap (never freed).
fn good_stack() -> u64 {
    let stack = vec![0u8; 16384].leak();
    (stack.as_ptr() as u64 + stack.len() as u64) & !15
}

static READY: AtomicBool = AtomicBool::new(false);

/// Upcall handler: skip every record of this vCPU's queue (whatever it holds).
fn consume(_frame: &mut IrqFrame) {
    let area = area(this_vcpu());
    let head = area.queue_head.0.load(Ordering::Acquire);
    area.queue_tail.0.store(head, Ordering::Release);
}

/// Upcall handler that never consumes anything.
fn ignore(_frame: &mut IrqFrame) {}

/// Register `entry` (a function of this image unless given), put `stacks` good stacks in the
/// pool, enable upcalls.
fn enable(entry: u64, handler: activm_stub::IrqHandler, stacks: usize) {
    enable_after(entry, handler, stacks, || {})
}

/// [`enable`], with `more_setup` run just before upcalls are enabled: no new activation (which
/// says setup is done, see [`together`]) can start before all of it is done.
fn enable_after(
    entry: u64,
    handler: activm_stub::IrqHandler,
    stacks: usize,
    more_setup: impl FnOnce(),
) {
    activm_stub::register_irq_handler(UPCALL_IRQ, handler);
    for _ in 0..stacks {
        push_top(good_stack());
    }
    let entry = if entry == 0 {
        toggle_entry as *const () as u64
    } else {
        entry
    };
    if raw(Hypercall::SaRegister, entry, 0, 0) != 0 {
        println!("hostile: activations unsupported (--no-activations?)");
        exit(3);
    }
    more_setup();
    if raw(Hypercall::SaEnable, 0, 0, 0) != 0 {
        println!("hostile: activations unsupported (--no-activations?)");
        exit(3);
    }
}

/// vCPU 0 sets things up with `setup` while the others wait; then every vCPU runs `then`.
///
/// `setup` enables upcalls last (`enable_after`), and every new activation's entry sets
/// `READY` too: vCPU 0 may lose its setup context to a preemption with hand-off right after
/// `sa_enable` (this app never resumes a context taken away), and its new activation goes
/// straight to its loop; without that, the other vCPUs would wait for `READY` for ever, their
/// queues filling up.
fn together(vcpu: u32, setup: impl FnOnce(), then: fn() -> !) -> ! {
    if nr_vcpus() < 2 {
        println!("hostile: this mode needs --vcpus 2");
        exit(2);
    }
    if vcpu == 0 {
        setup();
        READY.store(true, Ordering::Release);
    }
    while !READY.load(Ordering::Acquire) {
        pause();
    }
    then()
}

/// Where new activations start: say setup is done (one exists only after it, see
/// [`together`]), then toggle the concurrency like everybody else.
extern "C" fn toggle_entry(_vcpu: u64, _activation: u64) -> ! {
    READY.store(true, Ordering::Release);
    toggle()
}

/// Lower and raise the concurrency every millisecond, so processors are taken away (PREEMPTED)
/// and given back (NEWPROC) again and again; after 10 s the VMM has failed to stop the guest.
fn toggle() -> ! {
    let ms = tsc_khz();
    let deadline = rdtsc() + 10_000 * ms;
    let mut n = 0u64;
    while rdtsc() < deadline {
        n += 1;
        raw(Hypercall::SaSetConcurrency, 1 + (n % 2), 0, 0);
        let until = rdtsc() + ms;
        while rdtsc() < until {
            pause();
        }
    }
    let mode = activm_stub::args().next().unwrap_or("");
    println!("hostile {mode}: UNEXPECTED: still running after 10 s of preemptions");
    exit(1)
}

fn before_enable() -> ! {
    let yielded = raw(Hypercall::SaYield, 0, 0, 0);
    let preempt = raw(Hypercall::SaPreempt, 0, 0, 0);
    refused(
        "sa-before-enable",
        yielded == HC_UNSUPPORTED && preempt == HC_UNSUPPORTED,
        format_args!("sa_yield {yielded:#x}, sa_preempt {preempt:#x}"),
    )
}

fn preempt_nonexistent() -> ! {
    enable(preempt_nonexistent_entry as *const () as u64, consume, 4);
    preempt_nonexistent_part()
}

/// Where a new activation starts: beside a neighbour, vCPU 0's context may be taken right after
/// `sa_enable` (this app never resumes one; a CI run on 2026-11-29 ran the default entry's
/// 10 s toggle then), so the new activation makes the same calls, which change nothing.
extern "C" fn preempt_nonexistent_entry(_vcpu: u64, _activation: u64) -> ! {
    preempt_nonexistent_part()
}

fn preempt_nonexistent_part() -> ! {
    let results = [
        64,
        1000,
        u64::from(u32::MAX),
        u64::MAX,
        u64::from(nr_vcpus()),
    ]
    .map(|v| raw(Hypercall::SaPreempt, v, 0, 0));
    refused(
        "preempt-nonexistent",
        results.iter().all(|&r| r == 1),
        format_args!("sa_preempt of 64, 1000, u32::MAX, u64::MAX, nr_vcpus: {results:?}"),
    )
}

/// Queue tails set to nonsense, then USER upcalls sent to vCPU 1: no room anywhere. The
/// handler leaves the tails alone: one that consumed (tail = head) would mend them as soon as
/// the VMM's upcall watchdog raised the interrupt again (5 ms of a running vCPU's queue looking
/// untaken), and on a loaded host that came before the first NEWPROC: the queues worked, the
/// new activations used up the pool's 8 stacks and the guest was stopped for an empty pool
/// instead (CI-like load, 2026-11-29: 1 suite run in 20).
fn queue_indices_huge(vcpu: u32) -> ! {
    together(
        vcpu,
        || {
            enable_after(0, ignore, 8, || {
                for v in 0..nr_vcpus() {
                    area(v).queue_tail.0.store(0xdead_beef, Ordering::Release);
                }
            })
        },
        || {
            if this_vcpu() == 0 {
                for _ in 0..4 {
                    raw(Hypercall::SaPreempt, 1, 0, 0);
                }
            }
            toggle()
        },
    )
}

/// Takes upcalls but never consumes one, while its processors are taken and given back.
fn never_consumes(vcpu: u32) -> ! {
    together(vcpu, || enable(0, ignore, STACK_POOL_CAPACITY), toggle)
}

/// Upcall interrupts taken on vCPU 1 (the first is left with its record unconsumed).
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Upcall handler: the first interrupt consumes nothing (as a drain that ended early); later
/// ones consume the queue.
fn consume_second(frame: &mut IrqFrame) {
    if INTERRUPTS.fetch_add(1, Ordering::AcqRel) > 0 {
        consume(frame);
    }
}

/// vCPU 0 sends vCPU 1 one USER upcall; vCPU 1 takes its interrupt but leaves the record in
/// the queue. The VMM's upcall watchdog must raise the interrupt again (within its 5 ms bound
/// and a quantum), else the record would wait for ever. Beside a neighbour the vCPUs lose their
/// contexts to preemption (never resumed here): a new activation goes back to its vCPU's part.
fn consumes_late(vcpu: u32) -> ! {
    together(
        vcpu,
        // A full pool: every preemption beside the neighbour ends in a new activation that
        // takes a stack and never gives it back, and on a loaded host 4 ran out before vCPU 0
        // reported (CI-like load, 2026-11-29: 2 suite runs in 30, an empty pool).
        || {
            enable(
                consumes_late_entry as *const () as u64,
                consume_second,
                STACK_POOL_CAPACITY,
            )
        },
        consumes_late_part,
    )
}

/// New activations of `consumes-late`: setup is done (see [`together`]); back to the part.
extern "C" fn consumes_late_entry(_vcpu: u64, _activation: u64) -> ! {
    READY.store(true, Ordering::Release);
    consumes_late_part()
}

/// vCPU 0 sends the USER upcall once vCPU 1 runs, waits for the second interrupt and reports;
/// vCPU 1 waits.
fn consumes_late_part() -> ! {
    if this_vcpu() != 0 {
        V1_WAITS.store(true, Ordering::Release);
        loop {
            pause();
        }
    }
    let ms = tsc_khz();
    // vCPU 1 must run to be sent a USER upcall: until it does, sa_preempt refuses.
    let deadline = rdtsc() + 5_000 * ms;
    while !SENT.load(Ordering::Acquire) && rdtsc() < deadline {
        if V1_WAITS.load(Ordering::Acquire) && raw(Hypercall::SaPreempt, 1, 0, 0) == 0 {
            SENT.store(true, Ordering::Release);
        }
        pause();
    }
    let deadline = rdtsc() + 5_000 * ms;
    while INTERRUPTS.load(Ordering::Acquire) < 2 && rdtsc() < deadline {
        pause();
    }
    let n = INTERRUPTS.load(Ordering::Acquire);
    refused(
        "consumes-late",
        n >= 2,
        format_args!(
            "upcall interrupts on vCPU 1 with its record left: {}",
            n.min(2)
        ),
    )
}

/// The USER upcall was sent (`consumes-late`).
static SENT: AtomicBool = AtomicBool::new(false);

/// vCPU 1 runs its loop (`consumes-late`).
static V1_WAITS: AtomicBool = AtomicBool::new(false);

/// The first new activation finds a bad pool entry (`bad`: good top + offset; `None`: a VMM
/// page; `Some(u64::MAX)`: past RAM), or an entry point in the middle of the boot header.
fn bad_pool(vcpu: u32, _mode: &'static str, entry: u64, bad: &'static [Option<u64>]) -> ! {
    together(
        vcpu,
        || {
            enable_after(entry, consume, 0, || match bad.first() {
                Some(Some(u64::MAX)) => push_top(boot_info().mem_size + 0x10000),
                Some(Some(offset)) => push_top(good_stack() + offset),
                Some(None) => push_top(0x9000),
                // A garbage entry: each new activation faults on it at once, unless it is
                // preempted first (inside the upcall handler an interrupt ran before the
                // first bytes): its context then needs a new activation elsewhere. With one
                // stack that one found the pool empty, a different stop than the one this
                // case checks (once in a CI run beside a neighbour); with a few, a
                // garbage entry runs again and faults.
                None if entry != 0 => {
                    for _ in 0..8 {
                        push_top(good_stack());
                    }
                }
                None => {}
            })
        },
        toggle,
    )
}

fn stack_indices_corrupt(vcpu: u32) -> ! {
    together(
        vcpu,
        || {
            enable_after(0, consume, 4, || {
                header().stack_prod.0.store(1000, Ordering::Release);
            })
        },
        toggle,
    )
}

/// What `corrupt-records` writes over every byte of a record; `arg` comes back as this.
const JUNK: u64 = 0xa5a5_a5a5_a5a5_a5a5;
/// Junk records vCPU 0 has received.
static JUNK_SEEN: AtomicU32 = AtomicU32::new(0);

/// vCPU 0 consumes its queue and counts the junk in it, only from its own flow (an activation's
/// entry, then its loop), never from the upcall handler (which does nothing here): a context
/// taken away is never resumed by this app, so nothing may stay half done when one is. (A busy
/// flag that kept the handler out stayed set for good when vCPU 0 was preempted inside: its
/// queue was never consumed again.) The count goes up after the tail: records taken back
/// before that come again and are counted then.
fn take_junk() {
    let area = area(0);
    let head = area.queue_head.0.load(Ordering::Acquire);
    let tail = area.queue_tail.0.load(Ordering::Relaxed);
    let unconsumed = (head.wrapping_sub(tail) as usize).min(UPCALL_QUEUE_CAPACITY);
    let junk = (0..unconsumed)
        .filter(|&i| area.records[(tail as usize + i) % UPCALL_QUEUE_CAPACITY].arg == JUNK)
        .count();
    area.queue_tail.0.store(head, Ordering::Release);
    JUNK_SEEN.fetch_add(junk as u32, Ordering::AcqRel);
}

/// Every new activation of `corrupt-records` plays its vCPU's part. One starts only after setup
/// (activations are enabled last), so it says setup is done: vCPU 0's setup context may have
/// been taken away (and never resumed) before it did, and vCPU 1 would wait for it for ever.
extern "C" fn corrupt_entry(_vcpu: u64, _activation: u64) -> ! {
    READY.store(true, Ordering::Release);
    corrupt_part()
}

/// vCPU 1 lets USER records pile up unconsumed in its queue, overwrites every byte of them
/// with junk and gives its processor back: the VMM takes the junk back and must hand it on to
/// vCPU 0 without tripping over it. vCPU 0 sends the USER upcalls and counts what comes back.
/// Beside a neighbour both vCPUs lose their processors all along, and every new activation
/// takes a pool stack (never given back here): the pool is filled.
fn corrupt_records(vcpu: u32) -> ! {
    let entry = corrupt_entry as *const () as u64;
    together(
        vcpu,
        || enable(entry, ignore, STACK_POOL_CAPACITY),
        corrupt_part,
    )
}

fn corrupt_part() -> ! {
    const WANT: u32 = 5;
    let ms = tsc_khz();
    let deadline = rdtsc() + 10_000 * ms;
    let area1 = area(1);
    if this_vcpu() == 1 {
        loop {
            let head = area1.queue_head.0.load(Ordering::Acquire);
            let tail = area1.queue_tail.0.load(Ordering::Relaxed);
            if head.wrapping_sub(tail) >= 3 {
                for record in area1.records.iter() {
                    let bytes = record as *const _ as *mut u8;
                    // SAFETY: the guest may write anything into its own queue; the VMM treats
                    // the records as untrusted when it reads them back.
                    unsafe { bytes.write_bytes(0xa5, core::mem::size_of_val(record)) };
                }
                raw(Hypercall::SaYield, 0, 0, 0);
            }
            pause();
        }
    }
    while JUNK_SEEN.load(Ordering::Acquire) < WANT {
        take_junk();
        if rdtsc() > deadline {
            println!(
                "hostile corrupt-records: UNEXPECTED: {} junk records came back in 10 s",
                JUNK_SEEN.load(Ordering::Acquire)
            );
            exit(1);
        }
        if raw(Hypercall::SaPreempt, 1, 0, 0) == 1 {
            // vCPU 1 gave its processor back: ask for it again.
            raw(Hypercall::SaSetConcurrency, 2, 0, 0);
        }
        let until = rdtsc() + ms;
        while rdtsc() < until {
            pause();
        }
    }
    refused(
        "corrupt-records",
        true,
        format_args!("junk records taken back and delivered to vCPU 0"),
    )
}
