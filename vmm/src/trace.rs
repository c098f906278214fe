//! `--trace FILE`: vCPU state changes, upcalls and hypercalls as Chrome trace-event JSON
//! (open it in Perfetto or chrome://tracing). One process per guest, one thread per vCPU.
//!
//! Events are streamed to the file as they happen (through a 64 KiB buffer), so a long run
//! costs disk, not memory. The file is opened when the run starts and completed at its end.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug)]
struct Output {
    out: BufWriter<File>,
    events: usize,
    /// The first write error; the trace stops there.
    failed: Option<std::io::Error>,
}

/// A trace being recorded.
#[derive(Debug)]
pub struct Trace {
    start_tsc: u64,
    tsc_khz: u64,
    output: Mutex<Output>,
}

impl Trace {
    /// Create (or truncate) `path` and start the trace there.
    pub fn create(path: &Path, tsc_khz: u64) -> std::io::Result<Trace> {
        let mut out = BufWriter::with_capacity(64 * 1024, crate::hostfile::create_regular(path)?);
        writeln!(out, "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        Ok(Trace {
            start_tsc: crate::rdtsc(),
            tsc_khz: tsc_khz.max(1),
            output: Mutex::new(Output {
                out,
                events: 0,
                failed: None,
            }),
        })
    }

    /// Write one event object (with its separator).
    fn emit(&self, line: std::fmt::Arguments) {
        let mut output = self.output.lock().unwrap_or_else(|e| e.into_inner());
        if output.failed.is_some() {
            return;
        }
        // Metadata and events alike follow the header line; the first object has no comma.
        let sep = if output.events == 0 { "" } else { "," };
        let result = writeln!(output.out, "{sep}{line}");
        match result {
            Ok(()) => output.events += 1,
            Err(e) => output.failed = Some(e),
        }
    }

    pub fn name_guest(&self, guest: usize, name: &str) {
        self.emit(
            format_args!(
                "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{guest},\"args\":{{\"name\":\"{}\"}}}}",
                name.replace(['"', '\\'], "_")
            ),
        );
    }

    /// Names track `tid` of guest `guest` and places it at `sort` among the guest's tracks.
    pub fn name_track(&self, guest: usize, tid: u32, name: &str, sort: u32) {
        let name = name.replace(['"', '\\'], "_");
        self.emit(format_args!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{guest},\"tid\":{tid},\"args\":{{\"name\":\"{name}\"}}}}"
        ));
        self.emit(format_args!(
            "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{guest},\"tid\":{tid},\"args\":{{\"sort_index\":{sort}}}}}"
        ));
    }

    /// Microseconds since the trace started of timestamp `tsc` (the host's counter, which the
    /// guests' follows); `None` before the start.
    pub fn micros(&self, tsc: u64) -> Option<f64> {
        let ticks = tsc.checked_sub(self.start_tsc)?;
        Some(ticks as f64 * 1000.0 / self.tsc_khz as f64)
    }

    /// Writes one complete event object the caller formatted (`ts` from [`Trace::micros`]).
    pub fn raw(&self, event: std::fmt::Arguments) {
        self.emit(event);
    }

    fn push(&self, name: &'static str, phase: char, guest: usize, vcpu: u32, arg: u64) {
        let ts = self.micros(crate::rdtsc()).unwrap_or(0.0);
        let scope = if phase == 'i' { ",\"s\":\"t\"" } else { "" };
        self.emit(
            format_args!(
                "{{\"name\":\"{name}\",\"ph\":\"{phase}\",\"ts\":{ts:.3},\"pid\":{guest},\"tid\":{vcpu}{scope},\"args\":{{\"arg\":{arg}}}}}"
            ),
        );
    }

    /// The vCPU enters state `name` (a duration until [`Trace::end`]).
    pub fn begin(&self, guest: usize, vcpu: u32, name: &'static str) {
        self.push(name, 'B', guest, vcpu, 0);
    }

    pub fn end(&self, guest: usize, vcpu: u32, name: &'static str) {
        self.push(name, 'E', guest, vcpu, 0);
    }

    /// A point event (an upcall, a hypercall) with one numeric argument.
    pub fn instant(&self, guest: usize, vcpu: u32, name: &'static str, arg: u64) {
        self.push(name, 'i', guest, vcpu, arg);
    }

    /// Close the JSON and flush; returns how many objects (events and guest names) were
    /// written.
    pub fn finish(&self) -> std::io::Result<usize> {
        let mut output = self.output.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = output.failed.take() {
            return Err(e);
        }
        writeln!(output.out, "]}}")?;
        output.out.flush()?;
        Ok(output.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_valid_looking_json() {
        let path = crate::testing::TempPath::new("trace.json");
        let trace = Trace::create(&path, 2_000_000).unwrap();
        trace.name_guest(0, "demo");
        trace.begin(0, 1, "running");
        trace.instant(0, 1, "upcall PREEMPTED", 7);
        trace.end(0, 1, "running");
        assert_eq!(trace.finish().unwrap(), 4);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"displayTimeUnit\""));
        assert!(text.contains("\"ph\":\"B\""));
        assert!(text.contains("\"name\":\"upcall PREEMPTED\""));
        assert!(text.trim_end().ends_with("]}"));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["traceEvents"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn events_go_to_the_file_not_to_memory() {
        let path = crate::testing::TempPath::new("trace-stream.json");
        let trace = Trace::create(&path, 2_000_000).unwrap();
        for i in 0..100_000 {
            trace.instant(0, 0, "hypercall", i);
        }
        // All but the last buffer's worth is on disk already.
        let on_disk = std::fs::metadata(&path).unwrap().len();
        assert!(on_disk > 5_000_000, "{on_disk}");
        assert_eq!(trace.finish().unwrap(), 100_000);
    }
}
