//! The checks every guest ELF gets after a build: what the VMM's loader relies on, and no SSE
//! in the CPL0 code (the CPL0 emulator has none).

use std::path::Path;
use std::process::Command;

use super::GuestArch;

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Checks what the VMM relies on: a static ELF64 for `arch` whose lowest PT_LOAD segment starts
/// at the image base with the BootHeader magic, and on x86_64 (if objdump is there) no SSE in the
/// CPL0 code.
pub(crate) fn check_elf(arch: GuestArch, path: &Path) -> Result<(), String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: {what}", path.display());
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return Err(bad("not a little-endian ELF64 file"));
    }
    if u16_at(&b, 16) != 2 || u16_at(&b, 18) != arch.elf_machine() {
        return Err(bad(&format!(
            "not a static {arch:?} executable (ET_EXEC, e_machine {})",
            arch.elf_machine()
        )));
    }
    let (phoff, phentsize, phnum) = (
        u64_at(&b, 32) as usize,
        u16_at(&b, 54) as usize,
        u16_at(&b, 56) as usize,
    );
    let lowest = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .filter(|&ph| ph + 56 <= b.len() && u32_at(&b, ph) == 1)
        .min_by_key(|&ph| u64_at(&b, ph + 16))
        .ok_or_else(|| bad("no PT_LOAD segment"))?;
    let (offset, vaddr) = (u64_at(&b, lowest + 8) as usize, u64_at(&b, lowest + 16));
    if vaddr != arch.image_base() {
        return Err(bad(&format!(
            "lowest loadable address {vaddr:#x}, expected {:#x}",
            arch.image_base()
        )));
    }
    if b.get(offset..offset + 8) != Some(&protocol::boot::BOOT_HEADER_MAGIC.to_le_bytes()[..]) {
        return Err(bad("no BootHeader at the lowest loadable address"));
    }
    let header_arch = b.get(offset + 16..offset + 20).map(|a| u32_at(a, 0));
    if header_arch != Some(arch.boot_header_arch()) {
        return Err(bad(&format!(
            "BootHeader architecture {header_arch:?}, expected {} ({arch:?})",
            arch.boot_header_arch()
        )));
    }
    match arch {
        GuestArch::X86_64 => check_cpl0_sse(path),
        GuestArch::Aarch64 => Ok(()),
    }
}

/// Disassembles `[__activm_cpl0_start, __activm_cpl0_end)` and rejects MMX/SSE/AVX/x87 registers
/// and `xgetbv`/`xsetbv`: the CPL0 emulator of our KVM has none of them.
fn check_cpl0_sse(path: &Path) -> Result<(), String> {
    let symbol = |name: &str| -> Result<Option<u64>, String> {
        let out = match Command::new("nm").arg(path).output() {
            Ok(out) => out,
            Err(_) => return Ok(None),
        };
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|line| {
                let mut f = line.split_whitespace();
                let (addr, _, sym) = (f.next()?, f.next()?, f.next()?);
                (sym == name)
                    .then(|| u64::from_str_radix(addr, 16).ok())
                    .flatten()
            }))
    };
    let (Some(start), Some(end)) = (symbol("__activm_cpl0_start")?, symbol("__activm_cpl0_end")?)
    else {
        println!(
            "xtask: note: nm/objdump unavailable or no CPL0 range symbols: CPL0 SSE check skipped"
        );
        return Ok(());
    };
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(format!("--start-address={start:#x}"))
        .arg(format!("--stop-address={end:#x}"))
        .arg(path)
        .output();
    let Ok(out) = out
        .map_err(|_| ())
        .and_then(|o| if o.status.success() { Ok(o) } else { Err(()) })
    else {
        println!("xtask: note: objdump unavailable: CPL0 SSE check skipped");
        return Ok(());
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let forbidden = ["%xmm", "%ymm", "%zmm", "%mm", "%st", "xgetbv", "xsetbv"];
    for line in text.lines() {
        if forbidden.iter().any(|f| line.contains(f)) {
            return Err(format!(
                "{}: CPL0 code uses MMX/SSE/AVX/x87: {}",
                path.display(),
                line.trim()
            ));
        }
    }
    if !text.contains("iretq") {
        return Err(format!(
            "{}: CPL0 range {start:#x}..{end:#x} disassembled to nothing useful",
            path.display()
        ));
    }
    Ok(())
}
