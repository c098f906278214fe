//! The console: [`write_str`], and `print!`/`println!`, which format into a stack buffer and
//! issue one `console_write` hypercall per line (or per 512 bytes of a longer line).

use core::fmt;

use protocol::hypercall::MAX_WRITE_LEN;

use crate::hypercall;

/// Writes `bytes` to the console, one hypercall per `MAX_WRITE_LEN` bytes.
pub fn write_bytes(bytes: &[u8]) {
    for chunk in bytes.chunks(MAX_WRITE_LEN as usize) {
        hypercall::console_write(chunk);
    }
}

/// Writes `s` to the console.
pub fn write_str(s: &str) {
    write_bytes(s.as_bytes());
}

/// A fixed-size formatting buffer that truncates what does not fit.
#[derive(Debug)]
pub struct FixedBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> FixedBuf<N> {
    pub const fn new() -> Self {
        FixedBuf {
            buf: [0; N],
            len: 0,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Appends as much of `bytes` as fits; returns how much did.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        n
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl<const N: usize> Default for FixedBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Write for FixedBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// Buffers formatted output and writes it to the console when full or flushed.
#[derive(Debug, Default)]
pub struct LineWriter {
    buf: FixedBuf<512>,
}

impl LineWriter {
    pub const fn new() -> Self {
        LineWriter {
            buf: FixedBuf::new(),
        }
    }

    pub fn flush(&mut self) {
        if !self.buf.as_bytes().is_empty() {
            write_bytes(self.buf.as_bytes());
            self.buf.clear();
        }
    }
}

impl fmt::Write for LineWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s.as_bytes();
        loop {
            let n = self.buf.push(rest);
            rest = &rest[n..];
            if rest.is_empty() {
                return Ok(());
            }
            self.flush();
        }
    }
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments<'_>, newline: bool) {
    let mut w = LineWriter::new();
    let _ = fmt::Write::write_fmt(&mut w, args);
    if newline {
        let _ = fmt::Write::write_str(&mut w, "\n");
    }
    w.flush();
}

/// Prints to the console (one hypercall per call, up to 512 bytes).
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::console::_print(format_args!($($arg)*), false)
    };
}

/// Prints a line to the console (one hypercall per line, up to 512 bytes).
#[macro_export]
macro_rules! println {
    () => {
        $crate::console::_print(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::console::_print(format_args!($($arg)*), true)
    };
}
