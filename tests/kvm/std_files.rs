//! Files for std guests (`--mount`, the `fs_*` hypercalls, activm-std's file functions):
//! guests/apps/std-fs does std::fs work in a mounted directory, checked on the host too, then
//! tries to leave the mount in every way we know (the escape suite), with and without the
//! sandbox (openat2 beneath the mount holds alone; Landlock is a second wall).

use std::path::Path;

use activm::testing::TempPath;
use libtest_mimic::{Failed, Trial};

use super::activm_run;
use super::std_guests::{expect_stdout, std_guest};

const OPS_OUTPUT: &str = "read: hello world\n\
    seek 6: world\n\
    seek end-5: 6\n\
    fstat: len 11 file true dir false\n\
    fsync: 0\n\
    stat: len 12\n\
    mkdir again: errno 17\n\
    stat dir: dir true\n\
    readdir /data: [\".\", \"..\", \"a.txt\", \"sub\"]\n\
    rename: a errno 2 c hello world!\n\
    rmdir non-empty: errno 39\n\
    unlink: errno 2\n\
    readdir /data/sub: [\".\", \"..\", \"c.txt\"]\n\
    readdir 100: 102\n\
    big: equal true\n\
    open files: 256 then errno 24\n\
    ro read: hi\n\
    ro create: errno 30\n\
    ro write: errno 30\n\
    ro mkdir: errno 30\n\
    ro unlink: errno 30\n\
    ro rename: errno 30\n\
    missing: errno 2\n\
    done\n";

/// Every attempt of `std-fs escape` and its expected refusal (18 EXDEV: `openat2`'s
/// RESOLVE_BENEATH; 2 ENOENT: not under a mount; 16 EBUSY: the mount's root).
const ESCAPE_OUTPUT: &str = "dotdot: refused (errno 18)\n\
    dotdot2: refused (errno 18)\n\
    dotdot3: refused (errno 18)\n\
    absolute host path: refused (errno 2)\n\
    absolute inside mount: refused (errno 18)\n\
    unmapped: refused (errno 2)\n\
    relative: refused (errno 2)\n\
    symlink relative out: refused (errno 18)\n\
    symlink absolute: refused (errno 18)\n\
    symlink file: refused (errno 18)\n\
    symlink /proc/self/root: refused (errno 18)\n\
    stat through symlink: refused (errno 18)\n\
    readdir parent: refused (errno 18)\n\
    create outside: refused (errno 18)\n\
    mkdir outside: refused (errno 18)\n\
    unlink outside: refused (errno 18)\n\
    unlink via symlink: refused (errno 18)\n\
    rename to outside: refused (errno 18)\n\
    rename from outside: refused (errno 18)\n\
    rename mount root: refused (errno 16)\n\
    hard link: refused (error Unsupported)\n\
    rename race: refused (true)\n\
    inside: inside\n\
    done\n";

/// `root/{mnt, ro, outside}`: the writable mount, the read-only one, and what must stay
/// unreachable.
struct Tree {
    root: TempPath,
}

impl Tree {
    fn new(name: &str) -> Result<Tree, Failed> {
        let root = TempPath::dir(name)?;
        for dir in ["mnt", "ro", "outside"] {
            std::fs::create_dir(root.join(dir))?;
        }
        std::fs::write(root.join("ro/hello.txt"), "hi\n")?;
        std::fs::write(root.join("outside/secret.txt"), "secret\n")?;
        Ok(Tree { root })
    }

    fn path(&self, rel: &str) -> String {
        self.root.join(rel).display().to_string()
    }

    fn mounts(&self) -> [String; 4] {
        [
            "--mount".into(),
            format!("{}:/data", self.path("mnt")),
            "--mount".into(),
            format!("{}:/ro:ro", self.path("ro")),
        ]
    }

    /// Names in `rel`, sorted.
    fn list(&self, rel: &str) -> Result<Vec<String>, Failed> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join(rel))?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, std::io::Error>>()?;
        names.sort();
        Ok(names)
    }

    /// `rel` (a directory) holds exactly `names`.
    fn lists(&self, rel: &str, names: &[&str]) -> Result<(), Failed> {
        check(
            self.list(rel)? == names,
            &format!("{rel}/ does not hold {names:?}"),
        )
    }

    /// The file `rel` holds `text`.
    fn holds(&self, rel: &str, text: &str) -> Result<(), Failed> {
        let got = std::fs::read(self.root.join(rel))?;
        check(
            got == text.as_bytes(),
            &format!("{rel} does not hold {text:?}"),
        )
    }

    /// `--vcpus 2`, the mounts, then `extra`.
    fn options<'a>(&'a self, mounts: &'a [String; 4], extra: &[&'a str]) -> Vec<&'a str> {
        ["--vcpus", "2"]
            .into_iter()
            .chain(mounts.iter().map(String::as_str))
            .chain(extra.iter().copied())
            .collect()
    }

    /// What lies outside the writable mount is as the test made it.
    fn outside_unchanged(&self) -> Result<(), Failed> {
        self.lists("", &["mnt", "outside", "ro"])?;
        self.lists("outside", &["secret.txt"])?;
        self.holds("outside/secret.txt", "secret\n")?;
        self.lists("ro", &["hello.txt"])?;
        self.holds("ro/hello.txt", "hi\n")
    }
}

fn check(ok: bool, what: &str) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn run_ops(extra: &[&str]) -> Result<(), Failed> {
    let tree = Tree::new("std-fs-ops")?;
    let mounts = tree.mounts();
    let options = tree.options(&mounts, extra);
    let run = activm_run(&std_guest("std-fs")?, &options, &["ops"])?.expect_code(0)?;
    expect_stdout(&run.stdout, OPS_OUTPUT)?;
    tree.lists("mnt", &["big.bin", "sub"])?;
    tree.lists("mnt/sub", &["c.txt"])?;
    tree.holds("mnt/sub/c.txt", "hello world!")?;
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    check(
        std::fs::read(tree.root.join("mnt/big.bin"))? == big,
        "mnt/big.bin differs",
    )?;
    tree.outside_unchanged()
}

/// `std-fs slow 20` on 2 vCPUs and 1 processor: a 4 MiB file the host wrote and evicted from
/// its page cache is read, then a file is appended to and fsynced 20 times. The cold read and
/// every fsync wait for the host with the vCPU blocked in the VMM (`--stats`: file calls that
/// blocked it); with activations each is told by a BLOCKED and an UNBLOCKED record, and the
/// data is exact.
fn run_slow(extra: &[&str]) -> Result<(), Failed> {
    const SYNCS: u64 = 20;
    let tree = Tree::new("std-fs-slow")?;
    let cold: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = tree.root.join("mnt/cold.bin");
    let file = std::fs::File::create(&path)?;
    std::io::Write::write_all(&mut &file, &cold)?;
    file.sync_all()?;
    // SAFETY: advice on a descriptor we own; clean pages leave the page cache.
    let advice = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    check(advice == 0, "posix_fadvise(DONTNEED) failed")?;
    drop(file);
    let hash = cold
        .iter()
        .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mounts = tree.mounts();
    let mut base = vec!["--pcpus", "1", "--stats"];
    base.extend_from_slice(extra);
    let options = tree.options(&mounts, &base);
    let run = activm_run(
        &std_guest("std-fs")?,
        &options,
        &["slow", &SYNCS.to_string()],
    )?
    .expect_code(0)?;
    // Less the timing line (the console carries stderr too).
    let stdout: String = run
        .stdout
        .lines()
        .filter(|l| !l.starts_with("slow calls:"))
        .map(|l| format!("{l}\n"))
        .collect();
    expect_stdout(
        &stdout,
        &format!(
            "cold: {} bytes, hash {hash:x}\nfsync: {SYNCS} of {SYNCS}\n",
            cold.len()
        ),
    )?;
    let lines: String = (0..SYNCS).map(|i| format!("line {i}\n")).collect();
    tree.holds("mnt/synced.txt", &lines)?;
    let blocked = run
        .stderr
        .lines()
        .find_map(|l| l.split("slow file calls (vCPU blocked)=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
        .ok_or_else(|| format!("no file-call count in --stats\n{}", run.stderr))?;
    // The fsyncs, and at least the cold read's first call.
    check(
        blocked > SYNCS,
        &format!("{blocked} file calls blocked the vCPU, wanted more than {SYNCS}"),
    )?;
    let upcalls = |name| super::upcall_count(&run.stderr, name).unwrap_or(0);
    let (b, u) = (upcalls("BLOCKED"), upcalls("UNBLOCKED"));
    if extra.contains(&"--no-activations") {
        check(
            b == 0 && u == 0,
            &format!("oblivious: BLOCKED={b} UNBLOCKED={u}"),
        )?;
    } else {
        check(
            b >= blocked && u == b,
            &format!("{blocked} blocked file calls but BLOCKED={b} UNBLOCKED={u}"),
        )?;
    }
    tree.outside_unchanged()
}

fn run_escape(extra: &[&str]) -> Result<(), Failed> {
    let tree = Tree::new("std-fs-escape")?;
    let mnt = tree.root.join("mnt");
    std::fs::write(mnt.join("inside.txt"), "inside\n")?;
    std::fs::create_dir(mnt.join("sub"))?;
    let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, mnt.join(name));
    link(Path::new("../outside"), "link_out")?;
    link(&tree.root.join("outside"), "link_abs")?;
    link(Path::new("../outside/secret.txt"), "link_file")?;
    link(Path::new("/proc/self/root"), "link_proc")?;
    let mounts = tree.mounts();
    let options = tree.options(&mounts, extra);
    let outside = tree.path("outside");
    let run = activm_run(&std_guest("std-fs")?, &options, &["escape", &outside])?.expect_code(0)?;
    expect_stdout(&run.stdout, ESCAPE_OUTPUT)?;
    let mnt_names = [
        "inside.txt",
        "link_abs",
        "link_file",
        "link_out",
        "link_proc",
        "r",
        "sub",
    ];
    tree.lists("mnt", &mnt_names)?;
    tree.holds("mnt/inside.txt", "inside\n")?;
    tree.outside_unchanged()
}

pub(crate) fn tests() -> Vec<Trial> {
    vec![
        Trial::test("std_files_ops", || run_ops(&[])),
        Trial::test("std_files_ops_no_activations", || {
            run_ops(&["--no-activations"])
        }),
        Trial::test("std_files_slow_calls_block_the_vcpu", || run_slow(&[])),
        Trial::test("std_files_slow_calls_block_the_vcpu_no_activations", || {
            run_slow(&["--no-activations"])
        }),
        Trial::test("std_files_escape_suite", || run_escape(&[])),
        // openat2 beneath the mount holds without Landlock and seccomp too.
        Trial::test("std_files_escape_suite_no_sandbox", || {
            run_escape(&["--no-sandbox"])
        }),
        Trial::test("std_files_bad_pointer_stops_the_guest", || {
            activm_run(&std_guest("std-fs")?, &[], &["bad-pointer"])?
                .expect_code(125)?
                .stderr_has("malformed hypercall fs_open")?;
            Ok(())
        }),
        Trial::test("std_files_mounts_from_a_config_file", mounts_from_config),
        Trial::test("std_files_bad_mounts_are_refused", bad_mounts),
    ]
}

/// `mounts = [...]` in a [[guest]] table, the host directory relative to the file.
fn mounts_from_config() -> Result<(), Failed> {
    let tree = Tree::new("std-fs-config")?;
    let config = tree.root.join("guests.toml");
    std::fs::write(
        &config,
        format!(
            "timeout = 60\n[[guest]]\nimage = {:?}\nvcpus = 2\nargs = [\"ops\"]\n\
             mounts = [\"mnt:/data\", \"ro:/ro:ro\"]\n",
            std_guest("std-fs")?.display().to_string()
        ),
    )?;
    let output = std::process::Command::new(super::ACTIVM)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .output()?;
    let run = super::Run::from(output).expect_code(0)?;
    let want: String = OPS_OUTPUT
        .lines()
        .map(|l| format!("[std-fs] {l}\n"))
        .collect();
    if run.stdout != want && run.stdout != OPS_OUTPUT {
        return Err(format!("stdout differs\n--- got\n{}", run.stdout).into());
    }
    tree.holds("mnt/sub/c.txt", "hello world!")
}

/// A mount that is no directory, a relative guest directory, `..` in it: clear errors.
fn bad_mounts() -> Result<(), Failed> {
    let guest = std_guest("std-fs")?;
    let tree = Tree::new("std-fs-bad")?;
    let file = tree.path("ro/hello.txt");
    activm_run(&guest, &["--mount", &format!("{file}:/data")], &["ops"])?
        .expect_code(1)?
        .stderr_has("--mount")?;
    let missing = tree.path("missing");
    activm_run(&guest, &["--mount", &format!("{missing}:/data")], &["ops"])?
        .expect_code(1)?
        .stderr_has("--mount")?;
    let mnt = tree.path("mnt");
    for guest_dir in ["data", "/data/../x"] {
        activm_run(
            &guest,
            &["--mount", &format!("{mnt}:{guest_dir}")],
            &["ops"],
        )?
        .expect_code(2)?
        .stderr_has("guest directory")?;
    }
    tree.outside_unchanged()
}
