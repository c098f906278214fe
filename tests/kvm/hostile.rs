//! The hostile-guest suite: guests/apps/hostile breaks one rule of the protocol per mode, and
//! every mode runs alone and beside a well-behaved guest (rt-demo with activations) in the same
//! activm process. The hostile guest must get its documented status (125 for a protocol
//! violation or fault, with a message naming it; 101 for a panic; 0 when the VMM refuses with a
//! code the guest sees and checks) and the neighbour must finish with its exact result.

use std::process::Command;
use std::sync::Mutex;

use activm::testing::{raw_guest, TempPath, TRIPLE_FAULT_CODE};
use libtest_mimic::{Failed, Trial};

use super::{activm_run, guest, temp_disk, temp_image, Run, ACTIVM, GUEST_TIMEOUT_SECS};

/// One mode: the guest argument, the status, and text stderr (for 0: stdout) must hold.
struct Case {
    mode: &'static str,
    code: i32,
    says: &'static str,
}

const fn case(mode: &'static str, code: i32, says: &'static str) -> Case {
    Case { mode, code, says }
}

/// The triple-fault case boots a raw image instead of the hostile app.
const TRIPLE_FAULT: &str = "triple-fault";

const CASES: &[Case] = &[
    // Buffers outside RAM, past its end, wrapping around, too long, in the VMM's pages.
    case(
        "console-outside-ram",
        125,
        "console_write: buffer 0x7fff00000000+16",
    ),
    case("console-past-ram-end", 125, "lies outside guest RAM"),
    case("console-wraps", 125, "buffer 0xfffffffffffffff8+16"),
    case(
        "console-too-long",
        125,
        "length 65537 exceeds the limit of 65536",
    ),
    case(
        "console-vmm-pages",
        125,
        "buffer 0x1000+64 lies in the VMM's pages",
    ),
    case(
        "panic-bad-buffer",
        101,
        "<unreadable panic message: malformed hypercall panic",
    ),
    case(
        "blk-vmm-pages",
        125,
        "blk_read: buffer 0x8000+512 is not in guest RAM at or above",
    ),
    case(
        "blk-wraps",
        125,
        "blk_read: buffer 0xffffffffffffff00+512 is not in guest RAM",
    ),
    case(
        "blk-past-ram-end",
        125,
        "blk_write: buffer 0x7ffff00+512 is not in guest RAM",
    ),
    case("blk-count-zero", 125, "count 0 is not in 1..=256 sectors"),
    case("blk-count-huge", 125, "count 257 is not in 1..=256 sectors"),
    case(
        "blk-sector-huge",
        0,
        "ok (read 2, write 2, then a good read 0)",
    ),
    case(
        "blk-info-unknown",
        0,
        "ok (blk_info(99) = 0xffffffffffffffff)",
    ),
    case(
        "blk-ring-garbage",
        125,
        "malformed block submission (tag 5): unknown operation 7",
    ),
    case(
        "blk-ring-without-completions",
        125,
        "blk_submit_ring_setup: no completion ring: call blk_ring_setup first",
    ),
    // The hypercall page: unknown, misaligned, narrow calls, stores, past the page.
    case("unknown-hypercall", 125, "unknown hypercall 511 on vCPU 0"),
    case("hypercall-gap", 125, "unknown hypercall 7 on vCPU 0"),
    case(
        "misaligned-hypercall",
        125,
        "offset 0x14 is not 8-byte aligned",
    ),
    case(
        "narrow-hypercall",
        125,
        "a 4-byte load (hypercalls are 8-byte loads)",
    ),
    case(
        "store-hypercall",
        125,
        "a 8-byte store to the hypercall page at 0xfeb00010",
    ),
    case(
        "byte-store-hypercall",
        125,
        "a 1-byte store to the hypercall page at 0xfeb00963",
    ),
    case(
        "unbacked-load",
        125,
        "read unbacked guest-physical address 0xfeb01000",
    ),
    case("port-io", 125, "#GP general protection (vector 13) at CPL3"),
    case(
        "all-vcpus-stop",
        125,
        "every vCPU stopped without the guest calling exit",
    ),
    // The guard page under vCPU 0's CPL3 boot stack: a write fault at the stack pointer (before
    // the guard page, the overflow ran through the shared area into the image and the guest
    // died of a null write much later). `check` also compares cr2 with rsp.
    case("stack-overflow", 125, "#PF page fault (vector 14) at CPL3"),
    case(
        "hypercall-flood",
        0,
        "2 vCPUs x 10000 calls, 0 unexpected results",
    ),
    // Scheduler activations.
    case(
        "sa-register-outside-image",
        125,
        "upcall entry 0x1000 lies outside the guest image",
    ),
    case(
        "sa-enable-unregistered",
        125,
        "sa_enable before sa_register",
    ),
    case(
        "sa-before-enable",
        0,
        "ok (sa_yield 0xffffffffffffffff, sa_preempt 0xffffffffffffffff)",
    ),
    case(
        "concurrency-zero",
        125,
        "sa_setconcurrency(0): the guest has 2 vCPUs",
    ),
    case(
        "concurrency-max",
        125,
        "sa_setconcurrency(4294967295): the guest has 2 vCPUs",
    ),
    case("preempt-nonexistent", 0, "nr_vcpus: [1, 1, 1, 1, 1]"),
    case("queue-indices-huge", 125, "corrupted its queue indices"),
    case("never-consumes", 125, "does not consume its upcalls"),
    // A record whose interrupt was spent without the record taken gets the interrupt again.
    case(
        "consumes-late",
        0,
        "ok (upcall interrupts on vCPU 1 with its record left: 2)",
    ),
    // The upcall entry is the image base, the boot header: its bytes run as code until one
    // faults, and which fault and where depend on them (the ABI version among them: version 6
    // gives a #UD, 5 gave a #PF), so only the page is fixed.
    case("entry-garbage", 125, "at CPL3: rip=0x2000"),
    case(
        "stack-unaligned",
        125,
        "upcall stack pool entry 0 holds a bad stack top",
    ),
    case(
        "stack-outside-ram",
        125,
        "upcall stack pool entry 0 holds a bad stack top 0x8010000",
    ),
    case(
        "stack-in-vmm-pages",
        125,
        "upcall stack pool entry 0 holds a bad stack top 0x9000",
    ),
    case(
        "stack-pool-exhausted",
        125,
        "the guest's stack pool stays empty",
    ),
    case(
        "stack-indices-corrupt",
        125,
        "indices are corrupt (stack_prod 1000, stack_cons 0)",
    ),
    case(
        "corrupt-records",
        0,
        "ok (junk records taken back and delivered to vCPU 0)",
    ),
    case(
        TRIPLE_FAULT,
        125,
        "guest triple fault (KVM shutdown) on vCPU ",
    ),
];

/// The neighbour's exact result line.
const NEIGHBOUR_SAYS: &str =
    "[neighbour] rt-demo: 4 threads x 5000000 increments on 2 vCPUs: total 20000000 (expected 20000000)\n";

/// Guest RAM of the hostile guest (the cases' addresses past RAM depend on it).
const HOSTILE_MEM: &str = "128M";

fn check(case: &Case, run: Run, prefix: &str) -> Result<Run, Failed> {
    let run = run.expect_code(case.code)?;
    if case.code == 0 {
        run.stdout_has(&format!("{prefix}hostile {}: ", case.mode))?
            .stdout_has(case.says)
    } else if case.mode == "stack-overflow" {
        let run = run.stderr_has(case.says)?;
        // "... rsp=0x... error code=0x6 cr2=0x... (user write of an unmapped page)"
        let line = run
            .stderr
            .lines()
            .find(|l| l.contains(case.says))
            .unwrap_or("");
        let field = |name: &str| line.split(name).nth(1)?.split_whitespace().next();
        if field(" rsp=").is_none() || field(" rsp=") != field(" cr2=") {
            return Err(
                format!("the overflow did not fault on the guard page at rsp: {line}").into(),
            );
        }
        run.stderr_has("(user write of an unmapped page)")
    } else {
        run.stderr_has(&format!("activm: {prefix}"))?
            .stderr_has(case.says)
    }
}

/// The image of `case`: the hostile app, or a raw image that triple-faults.
fn image(case: &Case) -> Result<(Option<TempPath>, std::path::PathBuf), Failed> {
    if case.mode == TRIPLE_FAULT {
        let image = temp_image(
            "hostile-triple",
            &raw_guest(protocol::ABI_VERSION, TRIPLE_FAULT_CODE),
        )?;
        let path = image.path().to_path_buf();
        return Ok((Some(image), path));
    }
    Ok((None, guest("hostile")?))
}

fn alone(case: &Case) -> Result<(), Failed> {
    let (_keep, image) = image(case)?;
    let disk = temp_disk(&format!("hostile-{}", case.mode), 1)?;
    let options = [
        "--vcpus",
        "2",
        "--pcpus",
        "2",
        "--mem",
        HOSTILE_MEM,
        "--disk",
        disk.arg(),
    ];
    check(case, activm_run(&image, &options, &[case.mode])?, "")?;
    Ok(())
}

/// The case beside rt-demo (activations on, 2 vCPUs), both on a budget of 3 processors: the
/// allocator shares them and rotates the odd one, so both guests are preempted all along.
fn beside(case: &Case) -> Result<(), Failed> {
    let (_keep, image) = image(case)?;
    let dir = TempPath::dir(&format!("hostile-{}", case.mode))?;
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .map_err(|e| format!("cannot create {}: {e}", disk.display()))?;
    let file = dir.join("run.toml");
    let text = format!(
        "pcpus = 3\ntimeout = {GUEST_TIMEOUT_SECS}\n\n\
         [[guest]]\nimage = '{}'\nname = \"hostile\"\nvcpus = 2\nmem = \"{HOSTILE_MEM}\"\n\
         args = [\"{}\"]\ndisk = \"disk.img\"\n\n\
         [[guest]]\nimage = '{}'\nname = \"neighbour\"\nvcpus = 2\nargs = [\"4\", \"5000000\"]\n",
        image.display(),
        case.mode,
        guest("rt-demo")?.display()
    );
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let output = Command::new(ACTIVM)
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    check(case, Run::from(output), "[hostile] ")?
        .stdout_has(NEIGHBOUR_SAYS)?
        .stderr_has("activm: [neighbour] exit status 0")?;
    Ok(())
}

/// Run every case with `run` on three threads; report every failure, not only the first.
fn all_cases(run: fn(&Case) -> Result<(), Failed>) -> Result<(), Failed> {
    let next = Mutex::new(0usize);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| loop {
                let i = {
                    let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
                    *next += 1;
                    *next - 1
                };
                let Some(case) = CASES.get(i) else { break };
                if let Err(e) = run(case) {
                    let message = e.message().unwrap_or("failed").to_string();
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("case {}: {message}", case.mode));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n\n").into())
    }
}

/// The modes the app knows are exactly the cases here (none forgotten on either side).
fn cases_match_the_app() -> Result<(), Failed> {
    let output = Command::new(ACTIVM)
        .arg("run")
        .arg(guest("hostile")?)
        .args(["--timeout", GUEST_TIMEOUT_SECS, "--", "list"])
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    let run = Run::from(output).expect_code(2)?;
    let listed: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .collect();
    let ours: Vec<&str> = CASES
        .iter()
        .map(|c| c.mode)
        .filter(|&m| m != TRIPLE_FAULT)
        .collect();
    if listed != ours {
        return Err(
            format!("the hostile app's modes {listed:?}\ndiffer from the cases {ours:?}").into(),
        );
    }
    Ok(())
}

pub fn hostile_tests() -> Vec<Trial> {
    vec![
        Trial::test("hostile_guest_cases_alone", || {
            cases_match_the_app()?;
            all_cases(alone)
        }),
        Trial::test("hostile_guest_cases_beside_a_neighbour", || {
            all_cases(beside)
        }),
    ]
}
