//! The runtime's error type, shaped like `std::io::Error` for the calls where std returns an
//! `io::Result` (`thread::Builder::spawn`, `thread::available_parallelism`).

use core::fmt;

/// `std::io::ErrorKind`, the kinds the runtime produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A parameter was wrong (a thread name with a NUL byte).
    InvalidInput,
    /// Not available here.
    Unsupported,
    /// Memory ran out.
    OutOfMemory,
    /// Anything else.
    Other,
}

/// An error: a kind and a fixed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: &'static str,
}

impl Error {
    pub const fn new(kind: ErrorKind, message: &'static str) -> Error {
        Error { kind, message }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl core::error::Error for Error {}

/// `std::io::Result`.
pub type Result<T> = core::result::Result<T, Error>;
