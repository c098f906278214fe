//! Opening the files a user names (guest images, disks, the configuration) without trusting
//! what they are: a FIFO or a device must be refused, never waited on.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The largest configuration file read (a file of /dev/zero's kind is refused long before).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Open `path` (read-only, or read-write) only if it is a regular file. The open itself does
/// not block (O_NONBLOCK: a FIFO with no writer would wait forever), then the descriptor is
/// made blocking again for ordinary reads and writes.
pub fn open_regular(path: &Path, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    require_regular(&file)?;
    clear_nonblock(&file)?;
    Ok(file)
}

/// Create `path` for writing, or truncate it if it is a regular file; anything else there (a
/// FIFO, a device) is refused without blocking and left as it is.
pub fn create_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    require_regular(&file)?;
    file.set_len(0)?;
    clear_nonblock(&file)?;
    Ok(file)
}

fn require_regular(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (a {})", describe(kind)),
        ))
    }
}

fn clear_nonblock(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller owns; F_GETFL/F_SETFL touch no memory.
    let cleared = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if cleared {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Read a regular file of at most `cap` bytes as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64) -> io::Result<String> {
    let file = open_regular(path, false)?;
    let mut text = String::new();
    file.take(cap + 1).read_to_string(&mut text)?;
    if text.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempPath;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let path = TempPath::new("hostfile-fifo");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&path, false).unwrap_err();
        assert!(e.to_string().contains("not a regular file (a FIFO)"), "{e}");
        let e = read_text_capped(&path, 10).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = open_regular(Path::new("/dev/zero"), false).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = read_text_capped(Path::new("/tmp"), 10).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
    }

    #[test]
    fn create_leaves_special_files_alone() {
        let e = create_regular(Path::new("/dev/null")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let path = TempPath::with_contents("hostfile-create", b"old").unwrap();
        create_regular(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn text_is_capped() {
        let path = TempPath::with_contents("hostfile-big", &[b'a'; 100]).unwrap();
        assert_eq!(read_text_capped(&path, 100).unwrap().len(), 100);
        let e = read_text_capped(&path, 99).unwrap_err();
        assert!(e.to_string().contains("larger than 99 bytes"), "{e}");
    }
}
