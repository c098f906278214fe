//! Durability and host faults on the block device, with real guests: a write the guest flushed
//! survives a SIGKILL of activm right after the flush returned; a full host filesystem and a
//! disk file truncated and removed underneath reach the guest as error codes, never as a VMM
//! crash. The guest side is rt-tests' `blk-durable`, `blk-fill` and `blk-vanish` modes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use activm::testing::TempPath;
use libtest_mimic::{Failed, Trial};

use crate::{activm_run, guest, Run, ACTIVM, GUEST_TIMEOUT_SECS};

/// The byte rt-tests' `blk-durable` writes at `offset` of sector `sector`.
fn durable_pattern(sector: u64, offset: usize) -> u8 {
    (sector as usize * 131 + offset * 7 + 1) as u8
}

/// `activm run rt-tests --disk DISK -- ARGS` with its stdout piped, to be read as it runs.
fn spawn_rt_tests(disk: &Path, args: &[&str]) -> Result<Child, Failed> {
    Ok(Command::new(ACTIVM)
        .arg("run")
        .arg(guest("rt-tests")?)
        .args(["--timeout", GUEST_TIMEOUT_SECS, "--vcpus", "2", "--disk"])
        .arg(disk)
        .arg("--")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {ACTIVM}: {e}"))?)
}

/// Read the child's stdout until a line contains `text`; the lines read so far if it ends first.
fn wait_for_line(child: &mut Child, text: &str) -> Result<(), Failed> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut seen = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| e.to_string())?;
        seen += &line;
        seen.push('\n');
        if line.contains(text) {
            return Ok(());
        }
    }
    Err(format!("the guest ended without printing {text:?}; it printed:\n{seen}").into())
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted (and the directory removed) when
/// dropped.
struct Tmpfs {
    dir: TempPath,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, Failed> {
        let dir = TempPath::dir("tmpfs")?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !status.success() {
            return Err(format!("mounting a tmpfs failed ({status}): the test needs root").into());
        }
        Ok(Tmpfs { dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

pub fn tests() -> Vec<Trial> {
    vec![
        Trial::test("blk_flushed_writes_survive_sigkill", || {
            let disk = TempPath::zeroed("durable.img", 1 << 20)?;
            let mut child = spawn_rt_tests(disk.path(), &["blk-durable", "64"])?;
            let seen = wait_for_line(&mut child, "flushed 64");
            // SIGKILL at once: nothing of activm's own runs after the flush returned.
            let _ = child.kill();
            let _ = child.wait();
            seen?;
            let bytes = std::fs::read(disk.path()).map_err(|e| e.to_string())?;
            for (i, &b) in bytes[..64 * 512].iter().enumerate() {
                let want = durable_pattern(i as u64 / 512, i % 512);
                if b != want {
                    return Err(format!("byte {i} of the disk is {b:#x}, not {want:#x}").into());
                }
            }
            Ok(())
        }),
        Trial::test("blk_full_host_filesystem_is_an_io_error", || {
            // A 4 MiB sparse disk on a 1 MiB filesystem: writes fail once it is full.
            let fs = Tmpfs::mount("1m")?;
            let disk = fs.dir.path().join("disk.img");
            std::fs::File::create(&disk)
                .and_then(|f| f.set_len(4 << 20))
                .map_err(|e| e.to_string())?;
            let image = guest("rt-tests")?;
            let disk_arg = disk.to_str().ok_or("path")?;
            let run: Run =
                activm_run(&image, &["--vcpus", "2", "--disk", disk_arg], &["blk-fill"])?;
            run.expect_code(0)?
                .stdout_has("write error at sector")?
                .stdout_has(": Io\n")?
                .stdout_has("read after the error: Ok(()), data intact: true")?;
            Ok(())
        }),
        Trial::test(
            "blk_disk_truncated_and_removed_underneath_is_an_io_error",
            || {
                let disk = TempPath::zeroed("vanish.img", 1 << 20)?;
                let mut child = spawn_rt_tests(disk.path(), &["blk-vanish"])?;
                let stdout = child.stdout.take().ok_or("no stdout")?;
                let mut lines = BufReader::new(stdout).lines();
                let started = Instant::now();
                let mut out = String::new();
                let mut broken = false;
                while let Some(Ok(line)) = lines.next() {
                    out += &line;
                    out.push('\n');
                    if line == "ready" && !broken {
                        // Truncate the file to nothing, then remove it; activm keeps it open.
                        std::fs::File::options()
                            .write(true)
                            .open(disk.path())
                            .and_then(|f| f.set_len(0))
                            .map_err(|e| e.to_string())?;
                        std::fs::remove_file(disk.path()).map_err(|e| e.to_string())?;
                        broken = true;
                    }
                    if started.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                }
                let status = child.wait().map_err(|e| e.to_string())?;
                let wanted = "read error after truncation: Io\n";
                if status.code() != Some(0) || !out.contains(wanted) {
                    return Err(
                        format!("exit {status}, wanted 0 and {wanted:?}; stdout:\n{out}").into(),
                    );
                }
                Ok(())
            },
        ),
    ]
}
