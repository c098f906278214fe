//! Helpers for activm's own tests: hand-made guest images for the error paths.

/// A minimal ELF64 with one PT_LOAD segment holding `code` at `addr`.
pub fn tiny_elf(machine: u16, addr: u64, code: &[u8]) -> Vec<u8> {
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1;
    elf[6] = 1;
    elf[16..18].copy_from_slice(&2u16.to_le_bytes());
    elf[18..20].copy_from_slice(&machine.to_le_bytes());
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[24..32].copy_from_slice(&addr.to_le_bytes());
    elf[32..40].copy_from_slice(&64u64.to_le_bytes());
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    elf[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = 64;
    elf[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
    elf[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes());
    elf[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes());
    elf[ph + 16..ph + 24].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 24..ph + 32].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf.extend_from_slice(code);
    elf
}

/// A raw guest: a valid boot header (ABI `abi_version`) at the image base, followed by `code`,
/// which starts at the entry point `IMAGE_BASE + 64`.
pub fn raw_guest(abi_version: u32, code: &[u8]) -> Vec<u8> {
    use crate::arch::current::{abi::IMAGE_BASE, ELF_MACHINE};
    let mut image = Vec::with_capacity(64 + code.len());
    image.extend_from_slice(&protocol::boot::BOOT_HEADER_MAGIC.to_le_bytes());
    image.extend_from_slice(&abi_version.to_le_bytes());
    image.extend_from_slice(&64u32.to_le_bytes());
    image.extend_from_slice(&(protocol::Arch::CURRENT as u32).to_le_bytes());
    image.extend_from_slice(&0u32.to_le_bytes());
    image.extend_from_slice(&IMAGE_BASE.to_le_bytes());
    image.extend_from_slice(&16u64.to_le_bytes());
    image.extend_from_slice(&[0u8; 24]);
    image.extend_from_slice(code);
    let mut elf = tiny_elf(ELF_MACHINE, IMAGE_BASE, &image);
    // Entry point after the header.
    elf[24..32].copy_from_slice(&(IMAGE_BASE + 64).to_le_bytes());
    elf
}

/// x86_64 code that loads an empty IDT and raises #UD: a triple fault.
pub const TRIPLE_FAULT_CODE: &[u8] = &[
    0x0f, 0x01, 0x1d, 0x02, 0x00, 0x00, 0x00, // lidt 2(%rip)
    0x0f, 0x0b, // ud2
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // the empty IDT descriptor
];
