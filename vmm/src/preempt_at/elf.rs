//! The symbols of a guest ELF64 (its `.symtab`), for `--preempt-at`: by exact name, or by Rust
//! path (`activm_rt::upcall::recover::adopt`) against v0-mangled names.

/// A defined symbol.
#[derive(Clone, Copy, Debug)]
pub struct Symbol<'a> {
    pub name: &'a [u8],
    pub value: u64,
    pub size: u64,
    section: u16,
}

fn read_at<const N: usize>(bytes: &[u8], at: u64) -> Option<[u8; N]> {
    let at = usize::try_from(at).ok()?;
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u64_at(bytes: &[u8], at: u64) -> Option<u64> {
    read_at::<8>(bytes, at).map(u64::from_le_bytes)
}

fn u32_at(bytes: &[u8], at: u64) -> Option<u32> {
    read_at::<4>(bytes, at).map(u32::from_le_bytes)
}

fn u16_at(bytes: &[u8], at: u64) -> Option<u16> {
    read_at::<2>(bytes, at).map(u16::from_le_bytes)
}

/// Section `index`'s header: (address, file offset, size, link).
fn section(elf: &[u8], index: u64) -> Option<(u64, u64, u64, u32)> {
    let shoff = u64_at(elf, 0x28)?;
    let shentsize = u64::from(u16_at(elf, 0x3A)?);
    if index >= u64::from(u16_at(elf, 0x3C)?) {
        return None;
    }
    let sh = shoff.checked_add(index.checked_mul(shentsize)?)?;
    Some((
        u64_at(elf, sh + 16)?,
        u64_at(elf, sh + 24)?,
        u64_at(elf, sh + 32)?,
        u32_at(elf, sh + 40)?,
    ))
}

fn section_type(elf: &[u8], index: u64) -> Option<u32> {
    let sh = u64_at(elf, 0x28)?.checked_add(index * u64::from(u16_at(elf, 0x3A)?))?;
    u32_at(elf, sh + 4)
}

/// Every defined symbol of `elf`'s symbol tables (none if it has none or is malformed).
pub fn symbols(elf: &[u8]) -> Vec<Symbol<'_>> {
    const SHT_SYMTAB: u32 = 2;
    let mut out = Vec::new();
    let count = u16_at(elf, 0x3C).map_or(0, u64::from);
    for i in 0..count {
        if section_type(elf, i) != Some(SHT_SYMTAB) {
            continue;
        }
        let Some((_, offset, size, link)) = section(elf, i) else {
            continue;
        };
        let Some((_, str_off, str_size, _)) = section(elf, u64::from(link)) else {
            continue;
        };
        let strings = usize::try_from(str_off)
            .ok()
            .zip(usize::try_from(str_off.saturating_add(str_size)).ok())
            .and_then(|(a, b)| elf.get(a..b))
            .unwrap_or_default();
        for sym in (offset..offset.saturating_add(size)).step_by(24) {
            let (Some(name_at), Some(section), Some(value), Some(size)) = (
                u32_at(elf, sym),
                u16_at(elf, sym + 6),
                u64_at(elf, sym + 8),
                u64_at(elf, sym + 16),
            ) else {
                break;
            };
            let Some(tail) = strings.get(name_at as usize..) else {
                continue;
            };
            let name = &tail[..tail.iter().position(|&b| b == 0).unwrap_or(tail.len())];
            if section != 0 && !name.is_empty() {
                out.push(Symbol {
                    name,
                    value,
                    size,
                    section,
                });
            }
        }
    }
    out
}

/// The v0 mangling of a Rust path's segments (`a::bc` → `1a2bc`), without the crate's
/// disambiguator: the tail of the mangled name of an item at that path.
fn v0_path(path: &str) -> String {
    path.split("::")
        .map(|s| format!("{}{s}", s.len()))
        .collect()
}

/// A mangled name without the `.llvm.N` that LTO appends to the local items it promotes.
fn without_llvm_suffix(name: &[u8]) -> &[u8] {
    const SUFFIX: &[u8] = b".llvm.";
    match name.windows(SUFFIX.len()).position(|w| w == SUFFIX) {
        Some(at) => &name[..at],
        None => name,
    }
}

/// The symbol `name`: an exact symbol name, or (with `::`) the one v0-mangled item at that Rust
/// path.
pub fn lookup<'a>(elf: &'a [u8], name: &str) -> Result<Symbol<'a>, String> {
    let all = symbols(elf);
    if let Some(sym) = all.iter().find(|s| s.name == name.as_bytes()) {
        return Ok(*sym);
    }
    if !name.contains("::") {
        return Err(format!("no symbol {name}"));
    }
    let tail = v0_path(name);
    let found: Vec<_> = all
        .iter()
        .filter(|s| {
            s.name.starts_with(b"_R") && without_llvm_suffix(s.name).ends_with(tail.as_bytes())
        })
        .collect();
    match found[..] {
        [one] => Ok(*one),
        [] => Err(format!("no symbol {name}")),
        _ => Err(format!("{} symbols for {name}", found.len())),
    }
}

/// The address and the bytes in the file of the function symbol `name` ([`lookup`]).
pub fn function_bytes<'a>(elf: &'a [u8], name: &str) -> Result<(u64, &'a [u8]), String> {
    let sym = lookup(elf, name)?;
    let (addr, offset, _, _) = section(elf, u64::from(sym.section))
        .ok_or_else(|| format!("{name}: no section {}", sym.section))?;
    let start = sym
        .value
        .checked_sub(addr)
        .and_then(|d| d.checked_add(offset))
        .and_then(|s| usize::try_from(s).ok());
    let bytes = start
        .zip(usize::try_from(sym.size).ok())
        .and_then(|(s, n)| elf.get(s..s.checked_add(n)?));
    bytes
        .map(|b| (sym.value, b))
        .ok_or_else(|| format!("{name}: its bytes lie outside the file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v0_paths_are_length_prefixed() {
        assert_eq!(
            v0_path("activm_rt::upcall::recover::adopt"),
            "9activm_rt6upcall7recover5adopt"
        );
        assert_eq!(without_llvm_suffix(b"_RNv5adopt.llvm.7105"), b"_RNv5adopt");
        assert_eq!(without_llvm_suffix(b"_RNv5adopt"), b"_RNv5adopt");
    }

    #[test]
    fn an_elf_without_symbols_has_none() {
        let elf = crate::testing::tiny_elf(62, 0x20_0000, &[0x90]);
        assert!(symbols(&elf).is_empty());
        assert!(lookup(&elf, "main").is_err());
        assert!(lookup(&[], "a::b").is_err());
    }
}
