//! Integration tests: boot real guests under KVM with the `activm` binary and check what they
//! print and how they exit.
//!
//! Guests come from `cargo xtask build-guests` (the README's test command builds them first).
//! Without a usable `/dev/kvm` every test here is reported as *ignored*, with a banner on
//! stderr: never as passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use activm::testing::{raw_guest, tiny_elf, TRIPLE_FAULT_CODE};
use libtest_mimic::{Arguments, Failed, Trial};

const ACTIVM: &str = env!("CARGO_BIN_EXE_activm");
/// Upper bound on any one guest run, so a broken guest fails the test instead of hanging it.
const GUEST_TIMEOUT_SECS: &str = "60";

fn guest_dir() -> PathBuf {
    match std::env::var_os("ACTIVM_GUEST_DIR") {
        Some(dir) => dir.into(),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/target/x86_64-activm/release")
        }
    }
}

fn guest(name: &str) -> Result<PathBuf, Failed> {
    let path = guest_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "guest {} is missing: run `cargo xtask build-guests` first",
            path.display()
        )
        .into())
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn expect_code(self, code: i32) -> Result<Run, Failed> {
        if self.code == code {
            Ok(self)
        } else {
            Err(format!(
                "exit status {} (wanted {code})\n--- stdout\n{}--- stderr\n{}",
                self.code, self.stdout, self.stderr
            )
            .into())
        }
    }

    fn stdout_has(self, text: &str) -> Result<Run, Failed> {
        if self.stdout.contains(text) {
            Ok(self)
        } else {
            Err(format!(
                "stdout lacks {text:?}\n--- stdout\n{}--- stderr\n{}",
                self.stdout, self.stderr
            )
            .into())
        }
    }

    fn stderr_has(self, text: &str) -> Result<Run, Failed> {
        if self.stderr.contains(text) {
            Ok(self)
        } else {
            Err(format!(
                "stderr lacks {text:?}\n--- stdout\n{}--- stderr\n{}",
                self.stdout, self.stderr
            )
            .into())
        }
    }
}

/// `activm run <image> <options> -- <guest args>`.
fn activm_run(image: &Path, options: &[&str], guest_args: &[&str]) -> Result<Run, Failed> {
    let mut cmd = Command::new(ACTIVM);
    cmd.arg("run")
        .arg(image)
        .args(["--timeout", GUEST_TIMEOUT_SECS])
        .args(options);
    if !guest_args.is_empty() {
        cmd.arg("--").args(guest_args);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?;
    Ok(Run::from(output))
}

fn selftest(options: &[&str], guest_args: &[&str]) -> Result<Run, Failed> {
    activm_run(&guest("selftest")?, options, guest_args)
}

fn temp_image(name: &str, bytes: &[u8]) -> Result<PathBuf, Failed> {
    let path = std::env::temp_dir().join(format!("activm-test-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

fn demo_smp(vcpus: u32) -> Result<(), Failed> {
    let n = vcpus.to_string();
    let mut run = activm_run(&guest("demo")?, &["--vcpus", &n], &[])?.expect_code(0)?;
    for i in 0..vcpus {
        run = run.stdout_has(&format!("hello from vCPU {i} of {vcpus} at CPL3\n"))?;
    }
    run.stdout_has(&format!("all {vcpus} vCPUs reported"))?;
    Ok(())
}

fn kvm_tests() -> Vec<Trial> {
    let mut trials: Vec<Trial> = [1u32, 2, 4, 8]
        .into_iter()
        .map(|n| Trial::test(format!("smp_boot_{n}_vcpus"), move || demo_smp(n)))
        .collect();
    trials.extend([
        Trial::test("exit_code_is_passed_through", || {
            selftest(&[], &["exit", "7"])?.expect_code(7)?;
            selftest(&[], &["exit", "0"])?.expect_code(0)?;
            selftest(&[], &["exit", "300"])?.expect_code(300 & 0xff)?;
            Ok(())
        }),
        Trial::test("guest_panic_is_reported", || {
            selftest(&[], &["panic"])?
                .expect_code(101)?
                .stderr_has("guest panicked on vCPU 0")?
                .stderr_has("selftest panic on purpose")?;
            Ok(())
        }),
        Trial::test("guest_code_runs_at_cpl3", || {
            selftest(&["--vcpus", "2"], &["cpl"])?
                .expect_code(0)?
                .stdout_has("vcpu 0 cpl=3")?
                .stdout_has("vcpu 1 cpl=3")?;
            // A privileged instruction in guest code faults: it really is CPL3.
            selftest(&[], &["privileged"])?
                .expect_code(125)?
                .stderr_has("#GP general protection")?
                .stderr_has("at CPL3")?;
            Ok(())
        }),
        Trial::test("null_dereference_is_a_page_fault", || {
            selftest(&[], &["null"])?
                .expect_code(125)?
                .stderr_has("#PF page fault")?
                .stderr_has("cr2=0x0")?
                .stderr_has("user read of an unmapped page")?;
            Ok(())
        }),
        Trial::test("triple_fault_is_reported_with_registers", || {
            let image = temp_image(
                "triple",
                &raw_guest(protocol::ABI_VERSION, TRIPLE_FAULT_CODE),
            )?;
            activm_run(&image, &[], &[])?
                .expect_code(125)?
                .stderr_has("triple fault")?
                .stderr_has("rip=0x0000000000200047")?;
            Ok(())
        }),
        Trial::test("unknown_hypercall_is_refused", || {
            selftest(&[], &["unknown-hypercall"])?
                .expect_code(125)?
                .stderr_has("unknown hypercall 511")?;
            Ok(())
        }),
        Trial::test("malformed_hypercalls_are_refused", || {
            selftest(&[], &["misaligned-hypercall"])?
                .expect_code(125)?
                .stderr_has("not 8-byte aligned")?;
            selftest(&[], &["store-hypercall"])?
                .expect_code(125)?
                .stderr_has("hypercalls are loads")?;
            selftest(&[], &["bad-pointer"])?
                .expect_code(125)?
                .stderr_has("malformed hypercall console_write")?
                .stderr_has("outside guest RAM")?;
            Ok(())
        }),
        Trial::test("floating_point_works_at_cpl3", || {
            selftest(&[], &["fp"])?
                .expect_code(0)?
                .stdout_has("1.644933")?;
            Ok(())
        }),
        Trial::test("smp_atomics_add_up", || {
            selftest(&["--vcpus", "4"], &["smp"])?
                .expect_code(0)?
                .stdout_has("smp total=4000000 expected=4000000")?;
            Ok(())
        }),
        Trial::test("guest_arguments_arrive", || {
            selftest(&[], &["args", "one", "two words"])?
                .expect_code(0)?
                .stdout_has("argc=3")?
                .stdout_has("arg[1]=one\n")?
                .stdout_has("arg[2]=two words\n")?;
            Ok(())
        }),
        Trial::test("heap_allocation_works", || {
            selftest(&["--mem", "64M"], &["heap"])?
                .expect_code(0)?
                .stdout_has("heap ok")?;
            Ok(())
        }),
        Trial::test("cpl3_self_ipi_reaches_handler", || {
            selftest(&[], &["irq"])?
                .expect_code(0)?
                .stdout_has("irq ok")?;
            Ok(())
        }),
        Trial::test("timeout_stops_a_spinning_guest", || {
            let image = guest("selftest")?;
            let output = Command::new(ACTIVM)
                .args(["run", "--timeout", "1"])
                .arg(image)
                .args(["--", "spin"])
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output).expect_code(124)?.stderr_has("timeout")?;
            Ok(())
        }),
        Trial::test("boot_timing_is_reported", || {
            let run = activm_run(&guest("demo")?, &["--boot-timing", "--vcpus", "2"], &[])?
                .expect_code(0)?;
            let line = run
                .stderr
                .lines()
                .find(|l| l.contains("vCPU 0:") && l.contains("guest main"))
                .ok_or("no guest main line for vCPU 0 in --boot-timing output")?;
            let us: f64 = line
                .split_whitespace()
                .last()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("unparsable timing line {line:?}"))?;
            if !(us > 0.0 && us < 10_000_000.0) {
                return Err(format!("implausible boot time {us} us").into());
            }
            Ok(())
        }),
        Trial::test("abi_version_mismatch_is_refused", || {
            let image = temp_image(
                "abi",
                &raw_guest(protocol::ABI_VERSION + 1, TRIPLE_FAULT_CODE),
            )?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("ABI v2")?;
            Ok(())
        }),
        Trial::test("memory_too_small_is_refused", || {
            selftest(&["--mem", "2M"], &["exit", "0"])?
                .expect_code(1)?
                .stderr_has("guest memory too small")?;
            selftest(&["--mem", "3M"], &["exit", "0"])?
                .expect_code(1)?
                .stderr_has("multiple of 2 MiB")?;
            Ok(())
        }),
    ]);
    trials
}

/// Input errors: no guest code runs, but KVM may be opened.
fn input_tests() -> Vec<Trial> {
    vec![
        Trial::test("missing_image_is_refused", || {
            activm_run(Path::new("/nonexistent/guest.elf"), &[], &[])?
                .expect_code(1)?
                .stderr_has("cannot read guest image")?;
            Ok(())
        }),
        Trial::test("non_elf_image_is_refused", || {
            let image = temp_image("garbage", &[0x42; 4096])?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("not an ELF file")?;
            Ok(())
        }),
        Trial::test("aarch64_elf_is_refused", || {
            let image = temp_image("arm", &tiny_elf(183, 0x20_0000, &[0; 64]))?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("built for aarch64")?;
            Ok(())
        }),
        Trial::test("image_without_boot_header_is_refused", || {
            let image = temp_image("nohdr", &tiny_elf(62, 0x20_0000, &[0x90; 64]))?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("not an activm guest")?;
            Ok(())
        }),
        Trial::test("bad_vcpu_count_is_refused", || {
            let image = temp_image("vcpus", &[0x42; 64])?;
            activm_run(&image, &["--vcpus", "0"], &[])?
                .expect_code(1)?
                .stderr_has("--vcpus must be")?;
            activm_run(&image, &["--vcpus", "65"], &[])?
                .expect_code(1)?
                .stderr_has("--vcpus must be")?;
            Ok(())
        }),
        Trial::test("usage_errors_exit_2", || {
            let output = Command::new(ACTIVM)
                .args(["run"])
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output).expect_code(2)?.stderr_has("Usage")?;
            Ok(())
        }),
    ]
}

fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = kvm_tests();
    if let Err(why) = kvm_usable() {
        eprintln!("\n!!!!!!!! /dev/kvm is not usable ({why}): {} KVM tests are SKIPPED (shown as ignored) !!!!!!!!\n", trials.len());
        trials = trials
            .into_iter()
            .map(|t| t.with_ignored_flag(true))
            .collect();
    }
    trials.extend(input_tests());
    libtest_mimic::run(&args, trials).exit();
}
