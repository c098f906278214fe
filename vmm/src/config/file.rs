//! Reading a configuration file (see the module comment of `config`).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;

use super::{GuestSpec, Machine, Problem};

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
    /// Microseconds.
    io_inline_wait: Option<u64>,
    #[serde(default)]
    host_sched: bool,
    place_vcpus: Option<bool>,
    batch_sched_idle: Option<bool>,
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
    /// `KEY = "VALUE"` pairs (a table; keys in sorted order).
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    no_activations: bool,
    #[serde(default)]
    latency_critical: bool,
    #[serde(default)]
    prefault: bool,
    disk: Option<PathBuf>,
    #[serde(default)]
    disk_read_only: bool,
    #[serde(default)]
    mounts: Vec<String>,
    thread_stack: Option<Size>,
    thread_stacks: Option<u32>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    allow_connect: Vec<String>,
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
        io_inline_wait_us: doc.io_inline_wait.unwrap_or(defaults.io_inline_wait_us),
        host_sched: doc.host_sched,
        place_vcpus: doc.place_vcpus.unwrap_or(defaults.place_vcpus),
        batch_sched_idle: doc.batch_sched_idle,
        from_flags: Vec::new(),
    };
    let guests = doc
        .guest
        .into_iter()
        .map(|g| {
            let defaults = GuestSpec::new("");
            let mounts = g
                .mounts
                .iter()
                .map(|m| {
                    let mut mount = super::parse_mount(m)
                        .map_err(|e| Problem::usage(format!("{}: mounts: {e}", path.display())))?;
                    mount.host = here(mount.host);
                    Ok(mount)
                })
                .collect::<Result<Vec<_>, Problem>>()?;
            Ok(GuestSpec {
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
                env: g
                    .env
                    .into_iter()
                    .map(|(key, value)| super::EnvVar { key, value })
                    .collect(),
                activations: !g.no_activations,
                latency_critical: g.latency_critical,
                prefault: g.prefault,
                disk: g.disk.map(here),
                disk_read_only: g.disk_read_only,
                thread_stack: g.thread_stack.map_or(defaults.thread_stack, |s| s.0),
                thread_stacks: g.thread_stacks,
                mounts,
                publish: g.publish,
                allow_connect: g.allow_connect,
            })
        })
        .collect::<Result<_, Problem>>()?;
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
