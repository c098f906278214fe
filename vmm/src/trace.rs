//! `--trace FILE`: vCPU state changes, upcalls and hypercalls as Chrome trace-event JSON
//! (open it in Perfetto or chrome://tracing). One process per guest, one thread per vCPU.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug)]
struct TraceEvent {
    name: &'static str,
    /// 'B' begin, 'E' end, 'i' instant.
    phase: char,
    tsc: u64,
    guest: usize,
    vcpu: u32,
    arg: u64,
}

/// A trace being recorded.
#[derive(Debug)]
pub struct Trace {
    start_tsc: u64,
    tsc_khz: u64,
    events: Mutex<Vec<TraceEvent>>,
    guest_names: Mutex<Vec<String>>,
}

impl Trace {
    pub fn new(tsc_khz: u64) -> Trace {
        Trace {
            start_tsc: crate::rdtsc(),
            tsc_khz: tsc_khz.max(1),
            events: Mutex::new(Vec::new()),
            guest_names: Mutex::new(Vec::new()),
        }
    }

    pub fn name_guest(&self, guest: usize, name: &str) {
        let mut names = self.guest_names.lock().unwrap_or_else(|e| e.into_inner());
        if names.len() <= guest {
            names.resize(guest + 1, String::new());
        }
        names[guest] = name.to_string();
    }

    fn push(&self, name: &'static str, phase: char, guest: usize, vcpu: u32, arg: u64) {
        let event = TraceEvent {
            name,
            phase,
            tsc: crate::rdtsc(),
            guest,
            vcpu,
            arg,
        };
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
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

    pub fn write_to(&self, path: &Path) -> std::io::Result<usize> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let names = self.guest_names.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(out, "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        let mut first = true;
        for (guest, name) in names.iter().enumerate() {
            let sep = if first { "" } else { "," };
            first = false;
            writeln!(
                out,
                "{sep}{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{guest},\"args\":{{\"name\":\"{}\"}}}}",
                name.replace(['"', '\\'], "_")
            )?;
        }
        for e in events.iter() {
            let ts = e.tsc.saturating_sub(self.start_tsc) as f64 * 1000.0 / self.tsc_khz as f64;
            let sep = if first { "" } else { "," };
            first = false;
            let scope = if e.phase == 'i' { ",\"s\":\"t\"" } else { "" };
            writeln!(
                out,
                "{sep}{{\"name\":\"{}\",\"ph\":\"{}\",\"ts\":{ts:.3},\"pid\":{},\"tid\":{}{scope},\"args\":{{\"arg\":{}}}}}",
                e.name, e.phase, e.guest, e.vcpu, e.arg
            )?;
        }
        writeln!(out, "]}}")?;
        out.flush()?;
        Ok(events.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_valid_looking_json() {
        let trace = Trace::new(2_000_000);
        trace.name_guest(0, "demo");
        trace.begin(0, 1, "running");
        trace.instant(0, 1, "upcall PREEMPTED", 7);
        trace.end(0, 1, "running");
        let path = crate::testing::TempPath::new("trace.json");
        assert_eq!(trace.write_to(&path).unwrap(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"displayTimeUnit\""));
        assert!(text.contains("\"ph\":\"B\""));
        assert!(text.contains("\"name\":\"upcall PREEMPTED\""));
        assert!(text.trim_end().ends_with("]}"));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }
}
