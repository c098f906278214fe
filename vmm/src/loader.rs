//! Loading a guest ELF: validation, PT_LOAD segments into RAM, the boot header.

use std::io::Read;
use std::ops::Range;
use std::path::Path;

#[cfg(target_arch = "x86_64")]
use linux_loader::loader::{elf::Elf, KernelLoader};
use protocol::boot::{BootHeader, BOOT_HEADER_MAGIC};
#[cfg(target_arch = "x86_64")]
use vm_memory::GuestAddress;

use crate::arch::current::{abi::IMAGE_BASE, ELF_MACHINE};
use crate::error::Error;
use crate::memory::GuestRam;

const ELF64_PHDR_SIZE: u64 = 56;
const PT_LOAD: u32 = 1;
/// At most this many loadable segments (linkers emit a handful): loading copies each one, so
/// an image of thousands of large overlapping segments would take minutes.
pub const MAX_LOAD_SEGMENTS: u64 = 64;

/// What the VMM learned from a guest image before loading it.
#[derive(Clone, Debug)]
pub struct ImageInfo {
    pub entry: u64,
    /// `[lowest, highest)` loadable address.
    pub span: Range<u64>,
    /// The PT_LOAD segments, checked: (file offset, guest-physical address, file size, memory size).
    pub segments: Vec<(u64, u64, u64, u64)>,
}

fn machine_name(machine: u16) -> String {
    match machine {
        3 => "x86 (32-bit)".into(),
        40 => "arm (32-bit)".into(),
        62 => "x86_64".into(),
        183 => "aarch64".into(),
        243 => "riscv".into(),
        other => format!("machine {other}"),
    }
}

fn header_field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes[at..at + N].try_into().expect("in-bounds slice")
}

/// Read the ELF header and the program headers: the only parts of the file read before
/// loading (guest ELFs carry megabytes of debug information the VMM never needs).
fn read_headers(path: &Path) -> Result<(Vec<u8>, u64), Error> {
    let read_err = |source| Error::ImageRead {
        path: path.into(),
        source,
    };
    let mut file = crate::hostfile::open_regular(path, false).map_err(read_err)?;
    let file_len = file.metadata().map_err(read_err)?.len();
    let mut bytes = Vec::new();
    (&mut file)
        .take(64)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() == 64 && bytes[..4] == *b"\x7fELF" {
        let phoff = u64::from_le_bytes(header_field(&bytes, 32));
        let phnum = u16::from_le_bytes(header_field(&bytes, 56)) as u64;
        // Linkers put the program headers right after the ELF header; read anything else whole.
        if phoff == 64 {
            let table_len = (phnum * ELF64_PHDR_SIZE).min(file_len - 64);
            file.take(table_len)
                .read_to_end(&mut bytes)
                .map_err(read_err)?;
        } else {
            file.read_to_end(&mut bytes).map_err(read_err)?;
        }
    }
    Ok((bytes, file_len))
}

/// Check the ELF header and program headers of `path` without loading anything.
pub fn inspect(path: &Path, mem_size: u64) -> Result<ImageInfo, Error> {
    let (bytes, file_len) = read_headers(path)?;
    let bad = |reason: String| Error::BadElf {
        path: path.into(),
        reason,
    };
    if bytes.len() < 64 || bytes[..4] != *b"\x7fELF" {
        return Err(Error::NotElf { path: path.into() });
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF".into()));
    }
    let e_type = u16::from_le_bytes(header_field(&bytes, 16));
    let machine = u16::from_le_bytes(header_field(&bytes, 18));
    if machine != ELF_MACHINE {
        return Err(Error::WrongArch {
            path: path.into(),
            found: machine_name(machine),
            expected: protocol::Arch::CURRENT.name(),
        });
    }
    if e_type != 2 {
        return Err(bad(format!(
            "ELF type {e_type} is not a static executable (ET_EXEC)"
        )));
    }
    let entry = u64::from_le_bytes(header_field(&bytes, 24));
    let phoff = u64::from_le_bytes(header_field(&bytes, 32));
    let phentsize = u16::from_le_bytes(header_field(&bytes, 54)) as u64;
    let phnum = u16::from_le_bytes(header_field(&bytes, 56)) as u64;
    if phentsize != ELF64_PHDR_SIZE {
        return Err(bad(format!("program header size {phentsize}")));
    }
    let table_end = phnum
        .checked_mul(phentsize)
        .and_then(|n| n.checked_add(phoff));
    if table_end.is_none_or(|end| end > bytes.len() as u64) {
        return Err(bad("program headers lie outside the file".into()));
    }
    let (mut lowest, mut highest) = (u64::MAX, 0);
    let (mut segments, mut loaded_bytes) = (Vec::new(), 0u64);
    for i in 0..phnum {
        let at = (phoff + i * phentsize) as usize;
        let p_type = u32::from_le_bytes(header_field(&bytes, at));
        if p_type != PT_LOAD {
            continue;
        }
        let offset = u64::from_le_bytes(header_field(&bytes, at + 8));
        let paddr = u64::from_le_bytes(header_field(&bytes, at + 24));
        let filesz = u64::from_le_bytes(header_field(&bytes, at + 32));
        let memsz = u64::from_le_bytes(header_field(&bytes, at + 40));
        let file_end = offset.checked_add(filesz);
        if file_end.is_none_or(|end| end > file_len) || filesz > memsz {
            return Err(bad(format!("segment {i} lies outside the file")));
        }
        let end = paddr
            .checked_add(memsz)
            .ok_or_else(|| bad(format!("segment {i} overflows")))?;
        if paddr < IMAGE_BASE {
            return Err(bad(format!(
                "segment {i} at {paddr:#x} lies below the guest image base {IMAGE_BASE:#x}"
            )));
        }
        if end > mem_size {
            return Err(Error::MemTooSmall {
                needed: end,
                given: mem_size,
            });
        }
        loaded_bytes = loaded_bytes.saturating_add(memsz);
        if segments.len() as u64 >= MAX_LOAD_SEGMENTS {
            return Err(bad(format!(
                "more than {MAX_LOAD_SEGMENTS} loadable segments"
            )));
        }
        if loaded_bytes > mem_size {
            return Err(bad(format!(
                "its segments add up to more than the guest's memory ({mem_size:#x} bytes)"
            )));
        }
        lowest = lowest.min(paddr);
        highest = highest.max(end);
        segments.push((offset, paddr, filesz, memsz));
    }
    let span = lowest..highest;
    if span.start >= span.end {
        return Err(bad("no loadable segment".into()));
    }
    if !span.contains(&entry) {
        return Err(bad(format!(
            "entry point {entry:#x} lies outside the loaded image"
        )));
    }
    Ok(ImageInfo {
        entry,
        span,
        segments,
    })
}

/// Copy the PT_LOAD segments into RAM (linux-loader's ELF loader).
#[cfg(target_arch = "x86_64")]
fn load_segments(path: &Path, _info: &ImageInfo, ram: &GuestRam) -> Result<(), Error> {
    let mut file =
        crate::hostfile::open_regular(path, false).map_err(|source| Error::ImageRead {
            path: path.into(),
            source,
        })?;
    Elf::load(ram.inner(), None, &mut file, Some(GuestAddress(IMAGE_BASE))).map_err(|e| {
        Error::BadElf {
            path: path.into(),
            reason: e.to_string(),
        }
    })?;
    Ok(())
}

/// Copy the PT_LOAD segments `inspect` checked into RAM and zero their tails (linux-loader
/// loads ELF only for x86_64).
#[cfg(not(target_arch = "x86_64"))]
fn load_segments(path: &Path, info: &ImageInfo, ram: &GuestRam) -> Result<(), Error> {
    use std::io::{Seek, SeekFrom};
    let read_err = |source| Error::ImageRead {
        path: path.into(),
        source,
    };
    let mut file = crate::hostfile::open_regular(path, false).map_err(read_err)?;
    for &(offset, paddr, filesz, memsz) in &info.segments {
        let mut bytes = vec![0u8; memsz as usize];
        file.seek(SeekFrom::Start(offset)).map_err(read_err)?;
        file.read_exact(&mut bytes[..filesz as usize])
            .map_err(read_err)?;
        ram.write_bytes(paddr, &bytes)?;
    }
    Ok(())
}

/// Load the image into RAM and return its boot header.
pub fn load(path: &Path, info: &ImageInfo, ram: &GuestRam) -> Result<BootHeader, Error> {
    load_segments(path, info, ram)?;
    let header: BootHeaderRaw = ram.read_struct(info.span.start)?;
    if header.magic != BOOT_HEADER_MAGIC {
        return Err(Error::NoBootHeader {
            path: path.into(),
            addr: info.span.start,
        });
    }
    if header.abi_version != protocol::ABI_VERSION {
        return Err(Error::AbiMismatch {
            path: path.into(),
            guest: header.abi_version,
            vmm: protocol::ABI_VERSION,
        });
    }
    if header.arch != protocol::Arch::CURRENT as u32 {
        return Err(Error::BadElf {
            path: path.into(),
            reason: format!("boot header names architecture {}", header.arch),
        });
    }
    Ok(BootHeader {
        magic: header.magic,
        abi_version: header.abi_version,
        header_size: header.header_size,
        arch: header.arch,
        flags: header.flags,
        vectors: header.vectors,
        vector_stride: header.vector_stride,
        reserved: header.reserved,
    })
}

/// `BootHeader` with `Default`, for reading untrusted bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct BootHeaderRaw {
    magic: u64,
    abi_version: u32,
    header_size: u32,
    arch: u32,
    flags: u32,
    vectors: u64,
    vector_stride: u64,
    reserved: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<BootHeaderRaw>() == std::mem::size_of::<BootHeader>());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{tiny_elf, TempPath};

    /// A temporary file holding `bytes`, removed when the test ends (pass or fail).
    fn temp_file(name: &str, bytes: &[u8]) -> TempPath {
        TempPath::with_contents(&format!("loader-{name}"), bytes).unwrap()
    }

    #[test]
    fn rejects_non_elf() {
        let path = temp_file(
            "garbage",
            b"this is not an ELF file at all, not even close.....................",
        );
        assert!(matches!(
            inspect(&path, 64 << 20),
            Err(Error::NotElf { .. })
        ));
    }

    #[test]
    fn rejects_other_architecture() {
        // The other architecture's ELF machine and name.
        let (machine, name) = if ELF_MACHINE == 62 {
            (183, "aarch64")
        } else {
            (62, "x86_64")
        };
        let path = temp_file("other", &tiny_elf(machine, IMAGE_BASE, &[0; 16]));
        let err = inspect(&path, 64 << 20).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }

    #[test]
    fn rejects_segment_below_image_base() {
        let path = temp_file("low", &tiny_elf(ELF_MACHINE, 0x1000, &[0; 16]));
        assert!(inspect(&path, 64 << 20)
            .unwrap_err()
            .to_string()
            .contains("below"));
    }

    #[test]
    fn rejects_image_larger_than_memory() {
        let path = temp_file("big", &tiny_elf(ELF_MACHINE, 0x400_0000, &[0; 16]));
        assert!(matches!(
            inspect(&path, 32 << 20),
            Err(Error::MemTooSmall { .. })
        ));
    }

    #[test]
    fn rejects_truncated_program_headers() {
        let mut elf = tiny_elf(ELF_MACHINE, IMAGE_BASE, &[0; 16]);
        elf.truncate(80);
        let path = temp_file("trunc", &elf);
        assert!(inspect(&path, 64 << 20)
            .unwrap_err()
            .to_string()
            .contains("outside the file"));
    }

    /// `tiny_elf` with its one program header repeated `count` times.
    fn many_segments(count: u16) -> Vec<u8> {
        let one = tiny_elf(ELF_MACHINE, IMAGE_BASE, &[0; 16]);
        let phnum_at = 56;
        let phdr = one[64..64 + ELF64_PHDR_SIZE as usize].to_vec();
        let body = one[64 + ELF64_PHDR_SIZE as usize..].to_vec();
        let mut elf = one[..64].to_vec();
        elf[phnum_at..phnum_at + 2].copy_from_slice(&count.to_le_bytes());
        let shift = (count as u64 - 1) * ELF64_PHDR_SIZE;
        for _ in 0..count {
            let mut p = phdr.clone();
            let offset = u64::from_le_bytes(header_field(&p, 8)) + shift;
            p[8..16].copy_from_slice(&offset.to_le_bytes());
            elf.extend(p);
        }
        elf.extend(body);
        elf
    }

    #[test]
    fn too_many_segments_are_refused() {
        let path = temp_file("few", &many_segments(MAX_LOAD_SEGMENTS as u16));
        inspect(&path, 64 << 20).unwrap();
        let path = temp_file("many", &many_segments(65_535));
        let err = inspect(&path, 64 << 20).unwrap_err();
        assert!(
            err.to_string().contains("more than 64 loadable segments"),
            "{err}"
        );
    }

    #[test]
    fn a_fifo_image_is_refused() {
        let path = TempPath::new("loader-fifo");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = inspect(&path, 64 << 20).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn missing_boot_header_is_reported() {
        let elf = tiny_elf(ELF_MACHINE, IMAGE_BASE, &[0x90; 64]);
        let path = temp_file("nohdr", &elf);
        let info = inspect(&path, 64 << 20).unwrap();
        let ram = GuestRam::new(64 << 20).unwrap();
        assert!(matches!(
            load(&path, &info, &ram),
            Err(Error::NoBootHeader { .. })
        ));
    }

    #[test]
    fn abi_mismatch_is_reported() {
        let mut code = vec![0u8; 64];
        code[..8].copy_from_slice(&BOOT_HEADER_MAGIC.to_le_bytes());
        code[8..12].copy_from_slice(&(protocol::ABI_VERSION + 1).to_le_bytes());
        let path = temp_file("abi", &tiny_elf(ELF_MACHINE, IMAGE_BASE, &code));
        let info = inspect(&path, 64 << 20).unwrap();
        let ram = GuestRam::new(64 << 20).unwrap();
        let err = load(&path, &info, &ram).unwrap_err();
        let speaks = format!("speaks ABI v{}", protocol::ABI_VERSION);
        assert!(err.to_string().contains(&speaks), "{err}");
    }
}
