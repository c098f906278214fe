//! The hostile-guest suite on arm64 KVM: guests/apps/hostile breaks one rule of the protocol
//! per mode (as tests/kvm/hostile.rs does on x86_64), alone and (some modes) beside a
//! well-behaved guest. Where x86_64's expectation names x86 state, the aarch64 one names the
//! same event in aarch64 terms; `port-io` (no port I/O on aarch64) is `el1-register` here, and
//! the x86 raw-image triple fault has no aarch64 counterpart (an exception taken at EL1 is the
//! stub's `fatal_trap`, covered by `archcheck-fault`).

use super::case::Case;

/// Mode, exit status, and text its output must hold.
const MODES: &[(&str, i32, &str)] = &[
    (
        "console-outside-ram",
        125,
        "console_write: buffer 0x7fff00000000+16",
    ),
    ("console-past-ram-end", 125, "lies outside guest RAM"),
    ("console-wraps", 125, "buffer 0xfffffffffffffff8+16"),
    (
        "console-too-long",
        125,
        "length 65537 exceeds the limit of 65536",
    ),
    (
        "console-vmm-pages",
        125,
        "buffer 0x1000+64 lies in the VMM's pages",
    ),
    (
        "panic-bad-buffer",
        101,
        "<unreadable panic message: malformed hypercall panic",
    ),
    (
        "blk-vmm-pages",
        125,
        "blk_read: buffer 0x8000+512 is not in guest RAM at or above",
    ),
    (
        "blk-wraps",
        125,
        "blk_read: buffer 0xffffffffffffff00+512 is not in guest RAM",
    ),
    (
        "blk-past-ram-end",
        125,
        "blk_write: buffer 0x7ffff00+512 is not in guest RAM",
    ),
    ("blk-count-zero", 125, "count 0 is not in 1..=256 sectors"),
    ("blk-count-huge", 125, "count 257 is not in 1..=256 sectors"),
    (
        "blk-sector-huge",
        0,
        "ok (read 2, write 2, then a good read 0)",
    ),
    (
        "blk-info-unknown",
        0,
        "ok (blk_info(99) = 0xffffffffffffffff)",
    ),
    (
        "blk-ring-garbage",
        125,
        "malformed block submission (tag 5): unknown operation 7",
    ),
    (
        "blk-ring-without-completions",
        125,
        "blk_submit_ring_setup: no completion ring: call blk_ring_setup first",
    ),
    ("unknown-hypercall", 125, "unknown hypercall 511 on vCPU 0"),
    ("hypercall-gap", 125, "unknown hypercall 7 on vCPU 0"),
    (
        "misaligned-hypercall",
        125,
        "offset 0x14 is not 8-byte aligned",
    ),
    (
        "narrow-hypercall",
        125,
        "a 4-byte load (hypercalls are 8-byte loads)",
    ),
    (
        "store-hypercall",
        125,
        "a 8-byte store to the hypercall page at 0xfeb00010",
    ),
    (
        "byte-store-hypercall",
        125,
        "a 1-byte store to the hypercall page at 0xfeb00963",
    ),
    (
        "unbacked-load",
        125,
        "read unbacked guest-physical address 0xfeb01000",
    ),
    (
        "el1-register",
        125,
        "unknown reason (undefined instruction?)",
    ),
    (
        "all-vcpus-stop",
        125,
        "every vCPU stopped without the guest calling exit",
    ),
    ("stack-overflow", 125, ": data abort (ESR_EL1 "),
    (
        "hypercall-flood",
        0,
        "2 vCPUs x 10000 calls, 0 unexpected results",
    ),
    (
        "sa-register-outside-image",
        125,
        "upcall entry 0x1000 lies outside the guest image",
    ),
    (
        "sa-enable-unregistered",
        125,
        "sa_enable before sa_register",
    ),
    (
        "sa-before-enable",
        0,
        "ok (sa_yield 0xffffffffffffffff, sa_preempt 0xffffffffffffffff)",
    ),
    (
        "concurrency-zero",
        125,
        "sa_setconcurrency(0): the guest has 2 vCPUs",
    ),
    (
        "concurrency-max",
        125,
        "sa_setconcurrency(4294967295): the guest has 2 vCPUs",
    ),
    ("preempt-nonexistent", 0, "nr_vcpus: [1, 1, 1, 1, 1]"),
    ("queue-indices-huge", 125, "corrupted its queue indices"),
    ("never-consumes", 125, "does not consume its upcalls"),
    (
        "consumes-late",
        0,
        "ok (upcall interrupts on vCPU 1 with its record left: 2)",
    ),
    (
        "entry-garbage",
        125,
        "synchronous exception from EL0 on vCPU ",
    ),
    (
        "stack-unaligned",
        125,
        "upcall stack pool entry 0 holds a bad stack top",
    ),
    (
        "stack-outside-ram",
        125,
        "upcall stack pool entry 0 holds a bad stack top 0x8010000",
    ),
    (
        "stack-in-vmm-pages",
        125,
        "upcall stack pool entry 0 holds a bad stack top 0x9000",
    ),
    (
        "stack-pool-exhausted",
        125,
        "the guest's stack pool stays empty",
    ),
    (
        "stack-indices-corrupt",
        125,
        "indices are corrupt (stack_prod 1000, stack_cons 0)",
    ),
    (
        "corrupt-records",
        0,
        "ok (junk records taken back and delivered to vCPU 0)",
    ),
];

/// Modes also run beside a neighbour (rt-demo with activations, a budget of 3 processors for
/// the 4 vCPUs): the upcall abuses and a fault, where the shared allocator is most at risk.
///
/// Not `never-consumes`: its queues fill only under preemption pressure, which ends when the
/// short neighbour does (under TCG it once ran out the 150 s timeout; x86_64's neighbour runs
/// 250 times longer). Not `queue-indices-huge`: beside the neighbour under TCG the VMM once
/// stopped it for its empty stack pool before it saw the indices (125 either way).
const BESIDE: &[&str] = &[
    "stack-pool-exhausted",
    "hypercall-flood",
    "stack-overflow",
    "corrupt-records",
];

/// The neighbour's exact result line.
const NEIGHBOUR_SAYS: &str =
    "[neighbour] rt-demo: 4 threads x 20000 increments on 2 vCPUs: total 80000 (expected 80000)";

const DISK: &str =
    "[ -f /tmp/hostile.img ] || dd if=/dev/zero of=/tmp/hostile.img bs=1M count=1 2>/dev/null";

/// The overflow faulted on the guard page at the stack pointer: FAR_EL1 is SP_EL0 (x86_64
/// compares cr2 with rsp).
fn fault_at_sp(output: &str) -> Result<(), String> {
    let field = |name: &str| {
        let at = output.find(name)? + name.len();
        output[at..]
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()
    };
    match (field("FAR_EL1 "), field("sp_el0=")) {
        (Some(far), Some(sp)) if far == sp => Ok(()),
        (far, sp) => Err(format!(
            "the overflow did not fault at the stack pointer: FAR_EL1 {far:?}, sp_el0 {sp:?}"
        )),
    }
}

/// The app's own list of modes (its usage text) must be this suite's: a mode added to the
/// app is never silently left out here.
fn same_modes(output: &str) -> Result<(), String> {
    let listed: Vec<&str> = output
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .map(str::trim)
        .collect();
    let ours: Vec<&str> = MODES.iter().map(|m| m.0).collect();
    if listed != ours {
        return Err(format!(
            "the hostile app's modes {listed:?}\ndiffer from the cases {ours:?}"
        ));
    }
    Ok(())
}

pub(super) fn cases() -> Vec<Case> {
    let mut cases = vec![Case::new(
        "hostile-modes",
        "/activm run /guests/hostile -- list",
        2,
        &["usage: hostile MODE; modes:"],
    )
    .checked(same_modes)];
    for &(mode, status, says) in MODES {
        let name = format!("hostile-{mode}");
        let command = format!(
            "{DISK}; /activm run /guests/hostile --vcpus 2 --pcpus 2 --mem 128M \
             --disk /tmp/hostile.img --timeout 120 -- {mode}"
        );
        let hostile_says = format!("hostile {mode}: ");
        let mut expect = vec![says];
        if status == 0 {
            expect.push(&hostile_says);
        }
        cases.push(checked(mode, Case::new(name, &command, status, &expect)));
    }
    for &mode in BESIDE {
        let &(_, status, says) = MODES.iter().find(|m| m.0 == mode).expect("a listed mode");
        let name = format!("hostile-beside-{mode}");
        let command = format!(
            "{DISK}; cat > /tmp/beside-{mode}.toml <<EOF\n\
             pcpus = 3\ntimeout = 150\n\
             [[guest]]\nimage = \"/guests/hostile\"\nname = \"hostile\"\nvcpus = 2\n\
             mem = \"128M\"\ndisk = \"/tmp/hostile.img\"\nargs = [\"{mode}\"]\n\
             [[guest]]\nimage = \"/guests/rt-demo\"\nname = \"neighbour\"\nvcpus = 2\n\
             args = [\"4\", \"20000\"]\n\
             EOF\n\
             /activm run --config /tmp/beside-{mode}.toml"
        );
        let beside = [says, NEIGHBOUR_SAYS, "activm: [neighbour] exit status 0"];
        let case = Case::new(name, &command, status, &beside);
        cases.push(checked(mode, case));
    }
    cases
}

/// `case` with its mode's output check, if it has one.
fn checked(mode: &str, case: Case) -> Case {
    match mode {
        "stack-overflow" => case.checked(fault_at_sp),
        _ => case,
    }
}
