//! How a guest ended (`Outcome`) and the process exit status each ending maps to.

use std::time::Duration;

/// Exit status when the guest panicked.
pub const EXIT_GUEST_PANIC: i32 = 101;
/// Exit status when the guest faulted or broke the protocol.
pub const EXIT_GUEST_FAULT: i32 = 125;
/// Exit status when `--timeout` expired.
pub const EXIT_TIMEOUT: i32 = 124;

/// How a guest ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest called `exit(code)`.
    Exited(i32),
    /// The guest panicked with this message.
    Panicked { vcpu: u32, message: String },
    /// The guest faulted or broke the protocol; `report` says how, with registers.
    Fault { vcpu: u32, report: String },
    /// Every vCPU stopped without the guest calling `exit`.
    AllStopped,
    /// `--timeout` expired.
    TimedOut(Duration),
    /// Stopped by a host signal (SIGINT, SIGTERM) it could not take as an upcall, or a second one.
    Signaled(i32),
}

impl Outcome {
    pub fn fault(vcpu: u32, report: String) -> Outcome {
        Outcome::Fault { vcpu, report }
    }

    /// The process exit status this outcome maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(code) => *code,
            Outcome::Panicked { .. } => EXIT_GUEST_PANIC,
            Outcome::Fault { .. } | Outcome::AllStopped => EXIT_GUEST_FAULT,
            Outcome::TimedOut(_) => EXIT_TIMEOUT,
            Outcome::Signaled(signal) => 128 + signal,
        }
    }

    /// A message for stderr, if the outcome is not a plain exit.
    pub fn describe(&self) -> Option<String> {
        match self {
            Outcome::Exited(_) => None,
            Outcome::Panicked { vcpu, message } => {
                Some(format!("guest panicked on vCPU {vcpu}: {message}"))
            }
            Outcome::Fault { report, .. } => Some(format!("guest fault: {report}")),
            Outcome::AllStopped => Some("every vCPU stopped without the guest calling exit".into()),
            Outcome::TimedOut(after) => Some(format!(
                "guest still running after the {after:?} timeout; stopped"
            )),
            Outcome::Signaled(signal) => Some(format!("guest stopped by signal {signal}")),
        }
    }
}
