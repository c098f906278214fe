//! What `activm run` is asked to run, whichever way it was asked: machine-wide settings
//! ([`Machine`]) and one [`GuestSpec`] per guest, from command-line flags (`main.rs`) or from a
//! TOML file ([`load`]). [`build`] checks both the same way and turns them into the
//! `VmConfig`s and `MonitorOptions` the monitor runs; errors name the flag or the file and key
//! the value came from.
//!
//! The file has the machine-wide keys at the top and one `[[guest]]` table per guest, in order
//! (paths are relative to the file's directory):
//!
//! ```toml
//! pcpus = 2            # also: quantum (ms), chaos (seed), timeout (s), stats, boot_timing,
//! timeout = 60         #       trace, ctl, io_latency (us, for every guest with a disk)
//!
//! [[guest]]
//! image = "rt-tests"   # the only required key
//! name = "aware"       # label in console prefixes, --stats, `activm ctl`, traces
//! vcpus = 4
//! mem = "512M"         # a size: bytes, or a string with K/M/G
//! args = ["blk", "blk-overlap"]
//! disk = "disk.img"
//! disk_read_only = false
//! thread_stack = "124K"
//! thread_stacks = 256
//!
//! [[guest]]
//! image = "rt-tests"
//! name = "oblivious"
//! no_activations = true
//! ```
//!
//! Exit statuses follow `activm run --help`: a file that cannot be read, is not TOML, has an
//! unknown key, a value of the wrong type, a `[[guest]]` without `image`, no `[[guest]]` at all,
//! or two guests of one name is a usage error (2); values of the right type get the status the
//! same value gets as a flag (a vCPU count out of range is 1, a non-positive timeout 2).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;

use crate::devices::blk::DiskConfig;
use crate::monitor::{host_cpus, MonitorOptions};
use crate::vm::{VmConfig, DEFAULT_THREAD_STACK};

/// Exit status of a usage error.
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a setting activm cannot use (and of every failure to start a guest).
pub const EXIT_INVALID: u8 = 1;
/// The longest `--timeout`: a year, far beyond any run, far below what a Duration holds.
pub const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;
/// The longest `--quantum`: a minute.
pub const MAX_QUANTUM_MS: f64 = 60_000.0;

/// A setting, as errors name it: by its flag, or by its key in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Pcpus,
    Quantum,
    Timeout,
    IoLatency,
    Image,
    Name,
    Vcpus,
    Mem,
    Disk,
    DiskReadOnly,
    ThreadStack,
}

impl Key {
    /// The `activm run` flag.
    pub fn flag(self) -> &'static str {
        match self {
            Key::Pcpus => "--pcpus",
            Key::Quantum => "--quantum",
            Key::Timeout => "--timeout",
            Key::IoLatency => "--io-latency",
            Key::Image => "GUEST",
            Key::Name => "the guest name",
            Key::Vcpus => "--vcpus",
            Key::Mem => "--mem",
            Key::Disk => "--disk",
            Key::DiskReadOnly => "--disk-read-only",
            Key::ThreadStack => "--thread-stack",
        }
    }

    /// The key in a configuration file.
    pub fn key(self) -> &'static str {
        match self {
            Key::Pcpus => "pcpus",
            Key::Quantum => "quantum",
            Key::Timeout => "timeout",
            Key::IoLatency => "io_latency",
            Key::Image => "image",
            Key::Name => "name",
            Key::Vcpus => "vcpus",
            Key::Mem => "mem",
            Key::Disk => "disk",
            Key::DiskReadOnly => "disk_read_only",
            Key::ThreadStack => "thread_stack",
        }
    }
}

/// Settings for the whole machine: the processors and the services around the guests.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Physical CPUs shared by every guest (default: every host CPU).
    pub pcpus: Option<usize>,
    /// The allocator's time slice in milliseconds.
    pub quantum_ms: f64,
    /// Seed of the allocation chaos (`--chaos`).
    pub chaos: Option<u64>,
    /// Stop every guest after this many seconds.
    pub timeout_secs: Option<f64>,
    /// Print per-guest counters at the end.
    pub stats: bool,
    /// Report boot milestones.
    pub boot_timing: bool,
    /// Write a Chrome trace here.
    pub trace: Option<PathBuf>,
    /// Serve the control socket here.
    pub ctl: Option<PathBuf>,
    /// Emulated latency of every guest's disk, in microseconds.
    pub io_latency_us: u64,
    /// Settings a command-line flag set over a file's value: errors about them name the flag.
    pub from_flags: Vec<Key>,
}

impl Default for Machine {
    fn default() -> Self {
        Machine {
            pcpus: None,
            quantum_ms: 10.0,
            chaos: None,
            timeout_secs: None,
            stats: false,
            boot_timing: false,
            trace: None,
            ctl: None,
            io_latency_us: 0,
            from_flags: Vec::new(),
        }
    }
}

/// One guest, as asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestSpec {
    pub image: PathBuf,
    pub name: Option<String>,
    pub vcpus: u32,
    /// Guest RAM in bytes.
    pub mem: u64,
    pub args: Vec<String>,
    /// Scheduler activations allowed (`no_activations` clears it).
    pub activations: bool,
    pub disk: Option<PathBuf>,
    pub disk_read_only: bool,
    /// Usable bytes of each thread stack.
    pub thread_stack: u64,
    pub thread_stacks: Option<u32>,
}

impl GuestSpec {
    /// `image` with activm's defaults for the rest.
    pub fn new(image: impl Into<PathBuf>) -> GuestSpec {
        GuestSpec {
            image: image.into(),
            name: None,
            vcpus: 1,
            mem: DEFAULT_MEM,
            args: Vec::new(),
            activations: true,
            disk: None,
            disk_read_only: false,
            thread_stack: DEFAULT_THREAD_STACK,
            thread_stacks: None,
        }
    }
}

/// Guest RAM unless `--mem` or `mem` says otherwise.
pub const DEFAULT_MEM: u64 = 256 << 20;

/// Where the settings came from, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `activm run GUEST... [flags]`.
    Flags,
    /// A configuration file.
    File(PathBuf),
}

/// Why the settings cannot be run: the exit status and a message naming the flag or the file
/// and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub status: u8,
    pub message: String,
}

impl Problem {
    /// A usage error (exit status 2).
    pub fn usage(message: String) -> Problem {
        Problem {
            status: EXIT_USAGE,
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the monitor runs.
#[derive(Debug)]
pub struct RunPlan {
    pub guests: Vec<VmConfig>,
    pub options: MonitorOptions,
    /// Print `--stats` at the end.
    pub stats: bool,
}

/// How errors name guest `index`'s setting `key`, or the machine's (`index` `None`).
fn setting(
    source: &Source,
    machine: &Machine,
    guests: &[GuestSpec],
    key: Key,
    index: Option<usize>,
) -> String {
    match (source, index) {
        (Source::Flags, _) => key.flag().into(),
        (Source::File(_), None) if machine.from_flags.contains(&key) => key.flag().into(),
        (Source::File(path), None) => format!("{}: {}", path.display(), key.key()),
        (Source::File(path), Some(i)) => {
            format!(
                "{}: {}: {}",
                path.display(),
                guest_label(guests, i),
                key.key()
            )
        }
    }
}

/// `guest[1] ("name")`, or `guest[1]` for a guest without a name.
fn guest_label(guests: &[GuestSpec], index: usize) -> String {
    match guests.get(index).and_then(|g| g.name.as_ref()) {
        Some(name) => format!("guest[{index}] ({name:?})"),
        None => format!("guest[{index}]"),
    }
}

/// The same path, as far as the host can tell (a path that does not resolve stays as it is).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    resolve(a) == resolve(b)
}

/// Check `machine` and `guests` and turn them into what the monitor runs. `start_tsc` is the
/// TSC at process start (for `--boot-timing`).
pub fn build(
    machine: &Machine,
    guests: &[GuestSpec],
    source: &Source,
    start_tsc: u64,
) -> Result<RunPlan, Problem> {
    let name = |key: Key, index: Option<usize>| setting(source, machine, guests, key, index);
    let fail = |status: u8, key: Key, index: Option<usize>, what: &str| Problem {
        status,
        message: format!("{} {what}", name(key, index)),
    };
    if guests.is_empty() {
        return Err(Problem::usage(match source {
            Source::Flags => "no guest to run".into(),
            Source::File(path) => format!("{}: no [[guest]] to run", path.display()),
        }));
    }
    let timeout = match machine.timeout_secs {
        Some(secs) if !(secs > 0.0 && secs.is_finite()) => {
            return Err(fail(
                EXIT_USAGE,
                Key::Timeout,
                None,
                "must be a positive number of seconds",
            ))
        }
        Some(secs) if secs > MAX_TIMEOUT_SECS => {
            return Err(fail(
                EXIT_USAGE,
                Key::Timeout,
                None,
                &format!("is at most {MAX_TIMEOUT_SECS} seconds"),
            ))
        }
        other => other.and_then(|secs| Duration::try_from_secs_f64(secs).ok()),
    };
    if !(machine.quantum_ms > 0.0 && machine.quantum_ms.is_finite()) {
        return Err(fail(
            EXIT_USAGE,
            Key::Quantum,
            None,
            "must be a positive number of milliseconds",
        ));
    }
    if machine.quantum_ms > MAX_QUANTUM_MS {
        return Err(fail(
            EXIT_USAGE,
            Key::Quantum,
            None,
            &format!("is at most {MAX_QUANTUM_MS} milliseconds"),
        ));
    }
    if machine.pcpus == Some(0) {
        return Err(fail(EXIT_INVALID, Key::Pcpus, None, "must be at least 1"));
    }
    if machine.io_latency_us > 0 && guests.iter().all(|g| g.disk.is_none()) {
        return Err(fail(
            EXIT_USAGE,
            Key::IoLatency,
            None,
            "needs a guest with a disk",
        ));
    }
    for (i, guest) in guests.iter().enumerate() {
        if guest.image.as_os_str().is_empty() {
            return Err(fail(EXIT_USAGE, Key::Image, Some(i), "is empty"));
        }
        if guest.disk_read_only && guest.disk.is_none() {
            return Err(fail(EXIT_USAGE, Key::DiskReadOnly, Some(i), "needs a disk"));
        }
        if let Some(given) = &guest.name {
            if given.is_empty() || given.chars().any(char::is_control) {
                return Err(fail(
                    EXIT_USAGE,
                    Key::Name,
                    Some(i),
                    "must be non-empty, without control characters",
                ));
            }
            if let Some(first) = guests[..i]
                .iter()
                .position(|g| g.name.as_ref() == Some(given))
            {
                return Err(fail(
                    EXIT_USAGE,
                    Key::Name,
                    Some(i),
                    &format!("is also guest[{first}]'s: names must be unique"),
                ));
            }
        }
        if let Some(disk) = &guest.disk {
            let earlier = guests[..i]
                .iter()
                .position(|g| g.disk.as_deref().is_some_and(|d| same_file(d, disk)));
            if let Some(first) = earlier {
                if !(guest.disk_read_only && guests[first].disk_read_only) {
                    return Err(fail(
                        EXIT_USAGE,
                        Key::Disk,
                        Some(i),
                        &format!(
                            "{} is also guest[{first}]'s disk: guests share a disk only read-only",
                            disk.display()
                        ),
                    ));
                }
            }
        }
    }
    let mut configs = Vec::with_capacity(guests.len());
    for (i, guest) in guests.iter().enumerate() {
        let config = VmConfig {
            image: guest.image.clone(),
            name: guest.name.clone(),
            vcpus: guest.vcpus,
            mem_size: guest.mem,
            args: guest.args.clone(),
            boot_timing: machine.boot_timing,
            timeout,
            start_tsc,
            thread_stack_size: guest.thread_stack,
            thread_stacks: guest.thread_stacks,
            disk: guest.disk.as_ref().map(|path| DiskConfig {
                path: path.clone(),
                read_only: guest.disk_read_only,
                latency: Duration::from_micros(machine.io_latency_us),
            }),
            activations: guest.activations,
        };
        if let Err((key, what)) = config.check() {
            // The latency is the machine's setting, not the guest's.
            let index = (key != Key::IoLatency).then_some(i);
            return Err(fail(EXIT_INVALID, key, index, &what));
        }
        configs.push(config);
    }
    Ok(RunPlan {
        guests: configs,
        options: MonitorOptions {
            pcpus: machine.pcpus.unwrap_or_else(host_cpus),
            quantum: Duration::try_from_secs_f64(machine.quantum_ms / 1000.0)
                .unwrap_or(Duration::from_millis(10)),
            activations: true,
            timeout,
            trace: machine.trace.clone(),
            handle_signals: true,
            ctl_socket: machine.ctl.clone(),
            chaos_seed: machine.chaos,
        },
        stats: machine.stats,
    })
}

/// Parse `256M`, `1G`, `65536`, `64MiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (try 256M)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => return Err(format!("unknown size suffix {suffix:?} (use K, M or G)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A size in a file: a number of bytes, or a string `parse_size` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size(u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a number of bytes, or a string such as \"256M\"")
            }

            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<Size, E> {
                Ok(Size(bytes))
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<Size, E> {
                u64::try_from(bytes)
                    .map(Size)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(bytes), &self))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Size, E> {
                parse_size(text).map(Size).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    pcpus: Option<usize>,
    /// Milliseconds.
    quantum: Option<f64>,
    chaos: Option<u64>,
    /// Seconds.
    timeout: Option<f64>,
    #[serde(default)]
    stats: bool,
    #[serde(default)]
    boot_timing: bool,
    trace: Option<PathBuf>,
    ctl: Option<PathBuf>,
    /// Microseconds.
    #[serde(default)]
    io_latency: u64,
    #[serde(default, deserialize_with = "guest_tables")]
    guest: Vec<FileGuest>,
}

/// The `[[guest]]` tables (a plain `[guest]` table is refused with this in the message).
fn guest_tables<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<FileGuest>, D::Error> {
    struct Tables;
    impl<'de> Visitor<'de> for Tables {
        type Value = Vec<FileGuest>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("[[guest]] tables, one per guest")
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut guests = Vec::new();
            while let Some(guest) = seq.next_element()? {
                guests.push(guest);
            }
            Ok(guests)
        }
    }
    deserializer.deserialize_seq(Tables)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGuest {
    image: PathBuf,
    name: Option<String>,
    vcpus: Option<u32>,
    mem: Option<Size>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    no_activations: bool,
    disk: Option<PathBuf>,
    #[serde(default)]
    disk_read_only: bool,
    thread_stack: Option<Size>,
    thread_stacks: Option<u32>,
}

/// Read the configuration file at `path`.
pub fn load(path: &Path) -> Result<(Machine, Vec<GuestSpec>), Problem> {
    let text = crate::hostfile::read_text_capped(path, crate::hostfile::MAX_CONFIG_BYTES).map_err(
        |e| {
            Problem::usage(format!(
                "cannot read the configuration {}: {e}",
                path.display()
            ))
        },
    )?;
    parse(&text, path)
}

/// Parse a configuration file's `text`; `path` is where it was read from (relative paths in it
/// are relative to its directory, and errors name it).
pub fn parse(text: &str, path: &Path) -> Result<(Machine, Vec<GuestSpec>), Problem> {
    let doc: FileDoc =
        toml::from_str(text).map_err(|e| Problem::usage(describe_toml_error(path, text, &e)))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let here = |p: PathBuf| if p.is_absolute() { p } else { dir.join(p) };
    if doc.guest.is_empty() {
        return Err(Problem::usage(format!(
            "{}: no [[guest]] table: list at least one guest, each with an image",
            path.display()
        )));
    }
    let defaults = Machine::default();
    let machine = Machine {
        pcpus: doc.pcpus,
        quantum_ms: doc.quantum.unwrap_or(defaults.quantum_ms),
        chaos: doc.chaos,
        timeout_secs: doc.timeout,
        stats: doc.stats,
        boot_timing: doc.boot_timing,
        trace: doc.trace.map(here),
        ctl: doc.ctl.map(here),
        io_latency_us: doc.io_latency,
        from_flags: Vec::new(),
    };
    let guests = doc
        .guest
        .into_iter()
        .map(|g| {
            let defaults = GuestSpec::new("");
            GuestSpec {
                // An empty image stays empty, for `build` to refuse.
                image: if g.image.as_os_str().is_empty() {
                    g.image
                } else {
                    here(g.image)
                },
                name: g.name,
                vcpus: g.vcpus.unwrap_or(defaults.vcpus),
                mem: g.mem.map_or(defaults.mem, |s| s.0),
                args: g.args,
                activations: !g.no_activations,
                disk: g.disk.map(here),
                disk_read_only: g.disk_read_only,
                thread_stack: g.thread_stack.map_or(defaults.thread_stack, |s| s.0),
                thread_stacks: g.thread_stacks,
            }
        })
        .collect();
    Ok((machine, guests))
}

/// `FILE:LINE:COLUMN: KEY: what`, then the line with the spot marked.
fn describe_toml_error(path: &Path, text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return format!("{}: {message}", path.display());
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |at| at + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |at| start + at);
    let line = &text[line_start..line_end];
    let number = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let width = text[start..span.end.clamp(start, line_end)]
        .chars()
        .count()
        .max(1);
    let key = key_at(text, &span).map_or(String::new(), |key| format!("{key}: "));
    let gutter = " ".repeat(number.to_string().len());
    format!(
        "{}:{number}:{column}: {key}{message}\n{gutter} |\n{number} | {line}\n{gutter} | {}{}",
        path.display(),
        " ".repeat(column - 1),
        "^".repeat(width)
    )
}

/// The key (`guest[1].vcpus`) whose name or value holds `span`, the innermost one; `None` if
/// there is none or `text` does not parse.
fn key_at(text: &str, span: &std::ops::Range<usize>) -> Option<String> {
    use toml::de::{DeTable, DeValue};
    fn holds(outer: std::ops::Range<usize>, inner: &std::ops::Range<usize>) -> bool {
        outer.start <= inner.start && inner.end <= outer.end
    }
    /// Look inside `value` (at `path`, `depth` levels down) for a deeper match than `best`.
    fn walk(
        value: &DeValue<'_>,
        path: &str,
        depth: usize,
        span: &std::ops::Range<usize>,
        best: &mut Option<(usize, String)>,
    ) {
        fn found(best: &mut Option<(usize, String)>, depth: usize, path: String) {
            if best.as_ref().is_none_or(|(d, _)| depth > *d) {
                *best = Some((depth, path));
            }
        }
        match value {
            DeValue::Table(table) => {
                for (key, value) in table.iter() {
                    let path = match path {
                        "" => key.get_ref().to_string(),
                        _ => format!("{path}.{}", key.get_ref()),
                    };
                    if holds(key.span(), span) || holds(value.span(), span) {
                        found(best, depth + 1, path.clone());
                    }
                    walk(value.get_ref(), &path, depth + 1, span, best);
                }
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    if holds(item.span(), span) {
                        found(best, depth + 1, path.clone());
                    }
                    walk(item.get_ref(), &path, depth + 1, span, best);
                }
            }
            _ => {}
        }
    }
    let root = DeTable::parse(text).ok()?.into_inner();
    let mut best = None;
    walk(&DeValue::Table(root), "", 0, span, &mut best);
    best.map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "/etc/activm/run.toml";

    fn parse_ok(text: &str) -> (Machine, Vec<GuestSpec>) {
        parse(text, Path::new(FILE)).unwrap_or_else(|p| panic!("{}", p.message))
    }

    fn parse_err(text: &str) -> Problem {
        match parse(text, Path::new(FILE)) {
            Ok(parsed) => panic!("parsed: {parsed:?}"),
            Err(problem) => problem,
        }
    }

    fn build_err(text: &str) -> Problem {
        let (machine, guests) = parse_ok(text);
        match build(&machine, &guests, &Source::File(FILE.into()), 0) {
            Ok(plan) => panic!("built: {plan:?}"),
            Err(problem) => problem,
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn a_full_file_parses() {
        let (machine, guests) = parse_ok(
            r#"
            pcpus = 2
            quantum = 5
            chaos = 7
            timeout = 1.5
            stats = true
            boot_timing = true
            trace = "run.json"
            ctl = "/tmp/activm.sock"
            io_latency = 1000

            [[guest]]
            image = "apps/rt-tests"
            name = "aware"
            vcpus = 4
            mem = "512M"
            args = ["blk", "two words"]
            disk = "disk.img"
            disk_read_only = true
            thread_stack = 65536
            thread_stacks = 64

            [[guest]]
            image = "/opt/guests/demo"
            no_activations = true
            "#,
        );
        assert_eq!(
            machine,
            Machine {
                pcpus: Some(2),
                quantum_ms: 5.0,
                chaos: Some(7),
                timeout_secs: Some(1.5),
                stats: true,
                boot_timing: true,
                trace: Some("/etc/activm/run.json".into()),
                ctl: Some("/tmp/activm.sock".into()),
                io_latency_us: 1000,
                from_flags: Vec::new(),
            }
        );
        assert_eq!(
            guests[0],
            GuestSpec {
                image: "/etc/activm/apps/rt-tests".into(),
                name: Some("aware".into()),
                vcpus: 4,
                mem: 512 << 20,
                args: vec!["blk".into(), "two words".into()],
                activations: true,
                disk: Some("/etc/activm/disk.img".into()),
                disk_read_only: true,
                thread_stack: 64 << 10,
                thread_stacks: Some(64),
            }
        );
        assert_eq!(
            guests[1],
            GuestSpec {
                activations: false,
                ..GuestSpec::new("/opt/guests/demo")
            }
        );
    }

    #[test]
    fn a_minimal_file_takes_the_defaults() {
        let (machine, guests) = parse_ok("[[guest]]\nimage = \"demo\"\n");
        assert_eq!(machine, Machine::default());
        assert_eq!(guests, [GuestSpec::new("/etc/activm/demo")]);
        let (_, guests) = parse("[[guest]]\nimage = \"demo\"\n", Path::new("run.toml")).unwrap();
        assert_eq!(guests[0].image, Path::new("./demo"));
    }

    #[test]
    fn unknown_keys_are_named() {
        let p = parse_err("pcpu = 2\n[[guest]]\nimage = \"demo\"\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert!(
            p.message.starts_with(&format!(
                "{FILE}:1:1: pcpu: unknown field `pcpu`, expected one of"
            )),
            "{}",
            p.message
        );
        let p = parse_err("[[guest]]\nimage = \"demo\"\n[[guest]]\nimage = \"demo\"\nvcpu = 2\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert!(
            p.message
                .starts_with(&format!("{FILE}:5:1: guest[1].vcpu: unknown field `vcpu`")),
            "{}",
            p.message
        );
        assert!(
            p.message.ends_with("\n  |\n5 | vcpu = 2\n  | ^^^^"),
            "{}",
            p.message
        );
    }

    #[test]
    fn wrong_types_are_named() {
        for (text, start) in [
            (
                "[[guest]]\nimage = \"demo\"\nvcpus = \"four\"\n",
                ":3:9: guest[0].vcpus: invalid type: string \"four\", expected u32",
            ),
            (
                "[[guest]]\nimage = \"demo\"\nargs = \"exit 3\"\n",
                ":3:8: guest[0].args: invalid type: string \"exit 3\", expected a sequence",
            ),
            (
                "[[guest]]\nimage = \"demo\"\nargs = [\n  \"exit\",\n  3,\n]\n",
                ":5:3: guest[0].args[1]: invalid type: integer `3`, expected a string",
            ),
            (
                "[[guest]]\nimage = 7\n",
                ":2:9: guest[0].image: invalid type: integer `7`",
            ),
            (
                "stats = \"yes\"\n[[guest]]\nimage = \"demo\"\n",
                ":1:9: stats: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "pcpus = -1\n[[guest]]\nimage = \"demo\"\n",
                ":1:9: pcpus: invalid value: integer `-1`",
            ),
            (
                "[[guest]]\nimage = \"demo\"\nmem = \"12Q\"\n",
                ":3:7: guest[0].mem: unknown size suffix \"Q\" (use K, M or G)",
            ),
            (
                "[[guest]]\nimage = \"demo\"\nmem = -4\n",
                ":3:7: guest[0].mem: invalid value: integer `-4`, expected a size",
            ),
            (
                "[[guest]]\nimage = \"demo\"\nthread_stack = 1.5\n",
                ":3:16: guest[0].thread_stack: invalid type: floating point `1.5`, expected a size",
            ),
            (
                "[guest]\nimage = \"demo\"\n",
                ":1:1: guest: invalid type: map, expected [[guest]] tables, one per guest",
            ),
        ] {
            let p = parse_err(text);
            assert_eq!(p.status, EXIT_USAGE, "{text}");
            assert!(
                p.message.starts_with(&format!("{FILE}{start}")),
                "{start:?} at the start of {}",
                p.message
            );
        }
    }

    #[test]
    fn a_guest_needs_an_image_and_a_file_needs_a_guest() {
        let p = parse_err("[[guest]]\nimage = \"demo\"\n\n[[guest]]\nvcpus = 2\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert!(
            p.message
                .starts_with(&format!("{FILE}:4:1: guest[1]: missing field `image`")),
            "{}",
            p.message
        );
        for text in ["", "pcpus = 2\n", "guest = []\n"] {
            let p = parse_err(text);
            assert_eq!(p.status, EXIT_USAGE);
            assert_eq!(
                p.message,
                format!("{FILE}: no [[guest]] table: list at least one guest, each with an image")
            );
        }
        let p = build_err("[[guest]]\nimage = \"\"\n");
        assert_eq!(p.message, format!("{FILE}: guest[0]: image is empty"));
    }

    #[test]
    fn syntax_errors_say_where() {
        let p = parse_err("[[guest]]\nimage = \"demo\nvcpus = 2\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert!(
            p.message
                .starts_with(&format!("{FILE}:2:14: invalid basic string")),
            "{}",
            p.message
        );
    }

    #[test]
    fn values_are_checked_with_the_flags_statuses() {
        let p = build_err(
            "[[guest]]\nimage = \"demo\"\n[[guest]]\nimage = \"demo\"\nname = \"b\"\nvcpus = 0\n",
        );
        assert_eq!(p.status, EXIT_INVALID);
        assert_eq!(
            p.message,
            format!("{FILE}: guest[1] (\"b\"): vcpus must be between 1 and 64, not 0")
        );
        let p = build_err("[[guest]]\nimage = \"demo\"\nmem = \"3M\"\n");
        assert_eq!(p.status, EXIT_INVALID);
        assert!(p.message.starts_with(&format!(
            "{FILE}: guest[0]: mem must be a multiple of 2 MiB"
        )));
        let p = build_err("[[guest]]\nimage = \"demo\"\nthread_stack = \"1K\"\n");
        assert_eq!(
            p.message,
            format!("{FILE}: guest[0]: thread_stack must be between 4K and 64M")
        );
        let p = build_err("timeout = 0\n[[guest]]\nimage = \"demo\"\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert_eq!(
            p.message,
            format!("{FILE}: timeout must be a positive number of seconds")
        );
        let p = build_err("quantum = -1\n[[guest]]\nimage = \"demo\"\n");
        assert_eq!(p.status, EXIT_USAGE);
        // Huge values are usage errors, never a panic building a Duration.
        for (text, message) in [
            ("timeout = 1e30", "timeout is at most 31536000 seconds"),
            ("timeout = 1e19", "timeout is at most 31536000 seconds"),
            ("quantum = 1e300", "quantum is at most 60000 milliseconds"),
        ] {
            let p = build_err(&format!("{text}\n[[guest]]\nimage = \"demo\"\n"));
            assert_eq!(
                (p.status, p.message),
                (EXIT_USAGE, format!("{FILE}: {message}"))
            );
        }
        let p = build_err("pcpus = 0\n[[guest]]\nimage = \"demo\"\n");
        assert_eq!(
            (p.status, p.message),
            (EXIT_INVALID, format!("{FILE}: pcpus must be at least 1"))
        );
        let p = build_err("io_latency = 20000000\n[[guest]]\nimage = \"demo\"\ndisk = \"d.img\"\n");
        assert_eq!(p.status, EXIT_INVALID);
        assert_eq!(
            p.message,
            format!("{FILE}: io_latency is at most 10000000 us")
        );
    }

    #[test]
    fn a_flag_over_the_file_is_named_as_a_flag() {
        let (mut machine, guests) = parse_ok("timeout = 5\n[[guest]]\nimage = \"demo\"\n");
        machine.timeout_secs = Some(-1.0);
        machine.from_flags.push(Key::Timeout);
        let p = build(&machine, &guests, &Source::File(FILE.into()), 0).unwrap_err();
        assert_eq!(p.message, "--timeout must be a positive number of seconds");
    }

    #[test]
    fn disks_names_and_latency_are_checked_across_guests() {
        let p = build_err("[[guest]]\nimage = \"demo\"\ndisk_read_only = true\n");
        assert_eq!(p.status, EXIT_USAGE);
        assert_eq!(
            p.message,
            format!("{FILE}: guest[0]: disk_read_only needs a disk")
        );
        let p = build_err("io_latency = 100\n[[guest]]\nimage = \"demo\"\n");
        assert_eq!(
            p.message,
            format!("{FILE}: io_latency needs a guest with a disk")
        );
        let p = build_err(
            "[[guest]]\nimage = \"a\"\ndisk = \"d.img\"\n[[guest]]\nimage = \"b\"\ndisk = \"d.img\"\ndisk_read_only = true\n",
        );
        assert_eq!(p.status, EXIT_USAGE);
        assert_eq!(
            p.message,
            format!("{FILE}: guest[1]: disk /etc/activm/d.img is also guest[0]'s disk: guests share a disk only read-only")
        );
        let (machine, guests) = parse_ok(
            "[[guest]]\nimage = \"a\"\ndisk = \"d.img\"\ndisk_read_only = true\n[[guest]]\nimage = \"b\"\ndisk = \"d.img\"\ndisk_read_only = true\n",
        );
        assert!(build(&machine, &guests, &Source::File(FILE.into()), 0).is_ok());
        let p = build_err(
            "[[guest]]\nimage = \"a\"\nname = \"x\"\n[[guest]]\nimage = \"b\"\nname = \"x\"\n",
        );
        assert_eq!(
            p.message,
            format!("{FILE}: guest[1] (\"x\"): name is also guest[0]'s: names must be unique")
        );
        let p = build_err("[[guest]]\nimage = \"a\"\nname = \"\"\n");
        assert_eq!(p.status, EXIT_USAGE);
    }

    #[test]
    fn a_plan_carries_every_setting() {
        let (machine, guests) = parse_ok(
            r#"
            pcpus = 3
            quantum = 2.5
            timeout = 9
            io_latency = 300
            [[guest]]
            image = "a"
            name = "first"
            vcpus = 4
            args = ["x"]
            disk = "d.img"
            [[guest]]
            image = "b"
            no_activations = true
            "#,
        );
        let plan = build(&machine, &guests, &Source::File(FILE.into()), 42).unwrap();
        assert_eq!(plan.options.pcpus, 3);
        assert_eq!(plan.options.quantum, Duration::from_micros(2500));
        assert_eq!(plan.options.timeout, Some(Duration::from_secs(9)));
        assert!(plan.options.activations);
        let [a, b] = &plan.guests[..] else {
            panic!("two guests")
        };
        assert_eq!(
            (a.name.as_deref(), a.vcpus, a.activations),
            (Some("first"), 4, true)
        );
        assert_eq!(a.args, ["x"]);
        assert_eq!(a.start_tsc, 42);
        let disk = a.disk.as_ref().unwrap();
        assert_eq!(disk.latency, Duration::from_micros(300));
        assert_eq!(disk.path, Path::new("/etc/activm/d.img"));
        assert_eq!(
            (b.name.as_deref(), b.vcpus, b.activations),
            (None, 1, false)
        );
        assert!(b.disk.is_none());
    }

    #[test]
    fn flags_errors_name_the_flags() {
        let mut guest = GuestSpec::new("demo");
        guest.vcpus = 65;
        let p = build(&Machine::default(), &[guest], &Source::Flags, 0).unwrap_err();
        assert_eq!(
            (p.status, p.message.as_str()),
            (EXIT_INVALID, "--vcpus must be between 1 and 64, not 65")
        );
        let machine = Machine {
            quantum_ms: 0.0,
            ..Machine::default()
        };
        let p = build(&machine, &[GuestSpec::new("demo")], &Source::Flags, 0).unwrap_err();
        assert_eq!(
            (p.status, p.message.as_str()),
            (
                EXIT_USAGE,
                "--quantum must be a positive number of milliseconds"
            )
        );
    }
}
