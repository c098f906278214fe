//! Writing [`protocol::boot::BootInfo`], the argument block (arguments, then environment) and
//! the shared area's header.

use std::mem::offset_of;
use std::time::{SystemTime, UNIX_EPOCH};

use protocol::boot::{
    BootInfo, MemKind, MemRegion, VcpuBoot, BOOT_FLAG_ENTROPY, BOOT_FLAG_ENV, BOOT_FLAG_TIMING,
    BOOT_FLAG_WALL_CLOCK, BOOT_INFO_MAGIC, MAX_ARGS_LEN, MAX_MEM_REGIONS,
};
use protocol::shared::{
    SharedHeader, VcpuArea, VcpuRunState, SHARED_FEATURE_NET_DOORBELL, SHARED_FEATURE_TIMELINE,
    SHARED_FEATURE_YIELD_IO, SHARED_FEATURE_YIELD_NET, SHARED_FEATURE_YIELD_WAKE, SHARED_MAGIC,
    UPCALL_QUEUE_CAPACITY, VCPU_AREA_SIZE,
};
use protocol::{ABI_VERSION, MAX_VCPUS};

use crate::arch::current::{abi, boot::vmm_regions, layout, timestamp};
use crate::config::EnvVar;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

/// Host facts the boot info carries.
#[derive(Clone, Copy, Debug)]
pub struct HostFacts {
    pub tsc_khz: u64,
    pub vmm_start_tsc: u64,
    pub boot_timing: bool,
    /// The VMM records a trace and merges the runtime's timeline (`SHARED_FEATURE_TIMELINE`).
    pub timeline: bool,
}

/// Pack guest arguments as NUL-terminated strings.
pub fn pack_args(args: &[String]) -> Result<Vec<u8>, Error> {
    pack(args.iter().map(String::as_str), "guest argument")
}

/// Pack `strings` (`what` names them in errors) as NUL-terminated strings.
fn pack<'a>(strings: impl Iterator<Item = &'a str>, what: &str) -> Result<Vec<u8>, Error> {
    let mut packed = Vec::new();
    for text in strings {
        if text.as_bytes().contains(&0) {
            return Err(Error::Config(format!(
                "{what} {text:?} contains a NUL byte"
            )));
        }
        packed.extend_from_slice(text.as_bytes());
        packed.push(0);
    }
    if packed.len() > MAX_ARGS_LEN {
        return Err(Error::Config(format!(
            "{what}s take {} bytes; the limit is {MAX_ARGS_LEN}",
            packed.len()
        )));
    }
    Ok(packed)
}

/// The host's `CLOCK_REALTIME` in nanoseconds since the UNIX epoch and the counter the guest
/// reads as its clock (the host's TSC or CNTVCT_EL0: the guest's follows it) at the same
/// moment, taken as the middle of two counter reads around the clock read. `None` if the
/// host's clock is before the epoch.
pub fn wall_clock() -> Option<(u64, u64)> {
    let before = timestamp();
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    let after = timestamp();
    let ns = u64::try_from(since_epoch.as_nanos()).ok()?;
    Some((ns, before + after.saturating_sub(before) / 2))
}

pub fn write(
    ram: &GuestRam,
    plan: &Plan,
    args: &[String],
    env: &[EnvVar],
    host: HostFacts,
) -> Result<(), Error> {
    let packed = pack_args(args)?;
    let env_strings: Vec<String> = env.iter().map(EnvVar::to_string).collect();
    let packed_env = pack(
        env_strings.iter().map(String::as_str),
        "environment variable",
    )?;
    if packed.len() + packed_env.len() > MAX_ARGS_LEN {
        return Err(Error::Config(format!(
            "the guest arguments and environment take {} bytes; the limit is {MAX_ARGS_LEN}",
            packed.len() + packed_env.len()
        )));
    }
    let env_addr = layout::ARGS_ADDR + packed.len() as u64;
    ram.write_bytes(layout::ARGS_ADDR, &packed)?;
    ram.write_bytes(env_addr, &packed_env)?;
    let wall = wall_clock();

    let mut regions: Vec<(u64, u64, MemKind)> = vmm_regions().to_vec();
    regions.extend([
        (
            plan.image.start,
            plan.image.end - plan.image.start,
            MemKind::Image,
        ),
        (
            plan.shared_area.start,
            plan.shared_area.end - plan.shared_area.start,
            MemKind::SharedArea,
        ),
        (
            plan.boot_stacks.start,
            plan.boot_stacks.end - plan.boot_stacks.start,
            MemKind::BootStacks,
        ),
        (
            plan.stack_region.start,
            plan.stacks.bytes(),
            MemKind::ThreadStacks,
        ),
        (
            plan.heap.start,
            plan.heap.end - plan.heap.start,
            MemKind::Free,
        ),
        (
            abi::HYPERCALL_BASE,
            protocol::hypercall::HYPERCALL_PAGE_SIZE,
            MemKind::Hypercall,
        ),
    ]);
    assert!(regions.len() <= MAX_MEM_REGIONS);
    let mut mem_map = [MemRegion::EMPTY; MAX_MEM_REGIONS];
    for (slot, (start, size, kind)) in mem_map.iter_mut().zip(&regions) {
        *slot = MemRegion {
            start: *start,
            size: *size,
            kind: *kind as u32,
            _pad: 0,
        };
    }
    let mut vcpus = [VcpuBoot::EMPTY; MAX_VCPUS];
    for (i, vcpu) in vcpus.iter_mut().take(plan.nr_vcpus as usize).enumerate() {
        vcpu.user_stack_top = plan.user_stack_top(i as u32);
        vcpu.irq_id = i as u32;
    }
    let info = BootInfo {
        magic: BOOT_INFO_MAGIC,
        abi_version: ABI_VERSION,
        size: std::mem::size_of::<BootInfo>() as u32,
        nr_vcpus: plan.nr_vcpus,
        flags: if host.boot_timing {
            BOOT_FLAG_TIMING
        } else {
            0
        } | if wall.is_some() {
            BOOT_FLAG_WALL_CLOCK
        } else {
            0
        } | BOOT_FLAG_ENV
            | BOOT_FLAG_ENTROPY,
        tsc_khz: host.tsc_khz,
        vmm_start_tsc: host.vmm_start_tsc,
        mem_size: plan.mem_size,
        hypercall_base: abi::HYPERCALL_BASE,
        irq_controller_base: crate::arch::current::IRQ_CONTROLLER_BASE,
        shared_area: plan.shared_area.start,
        shared_area_size: plan.shared_area.end - plan.shared_area.start,
        heap_start: plan.heap.start,
        heap_end: plan.heap.end,
        args: layout::ARGS_ADDR,
        args_len: packed.len() as u32,
        argc: args.len() as u32,
        nr_mem_regions: regions.len() as u32,
        _pad: 0,
        mem_map,
        vcpus,
        stack_region: plan.stack_region.start,
        stack_slot_size: plan.stacks.slot_size,
        nr_stack_slots: plan.stacks.slots,
        _pad2: 0,
        wall_clock_ns: wall.map_or(0, |(ns, _)| ns),
        wall_clock_tsc: wall.map_or(0, |(_, tsc)| tsc),
        env: env_addr,
        env_len: packed_env.len() as u32,
        envc: env.len() as u32,
        entropy_seed: host_entropy()?,
    };
    ram.write_struct(layout::BOOT_INFO_ADDR, &info)?;
    write_shared_area(ram, plan, host.timeline)
}

/// 32 bytes from the host kernel's random generator (`getrandom(2)`, blocking until it is
/// seeded, which it is long before anyone runs activm).
fn host_entropy() -> Result<[u8; 32], Error> {
    let mut seed = [0u8; 32];
    let mut got = 0;
    while got < seed.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `seed`.
        let n = unsafe { libc::getrandom(seed[got..].as_mut_ptr().cast(), seed.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Host(format!("getrandom for the guest's seed: {e}")));
            }
        } else {
            got += n as usize;
        }
    }
    Ok(seed)
}

fn write_shared_area(ram: &GuestRam, plan: &Plan, timeline: bool) -> Result<(), Error> {
    let base = plan.shared_area.start;
    ram.write_u64(base + offset_of!(SharedHeader, magic) as u64, SHARED_MAGIC)?;
    ram.write_u32(
        base + offset_of!(SharedHeader, abi_version) as u64,
        ABI_VERSION,
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, nr_vcpus) as u64,
        plan.nr_vcpus,
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, vcpu_area_size) as u64,
        VCPU_AREA_SIZE as u32,
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, queue_capacity) as u64,
        UPCALL_QUEUE_CAPACITY as u32,
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, features) as u64,
        SHARED_FEATURE_YIELD_WAKE
            | SHARED_FEATURE_YIELD_IO
            | SHARED_FEATURE_YIELD_NET
            | SHARED_FEATURE_NET_DOORBELL
            | if timeline { SHARED_FEATURE_TIMELINE } else { 0 },
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, granted_vcpus) as u64,
        plan.nr_vcpus,
    )?;
    ram.write_u32(
        base + offset_of!(SharedHeader, requested_concurrency) as u64,
        plan.nr_vcpus,
    )?;
    for i in 0..plan.nr_vcpus {
        let area = plan.vcpu_area(i);
        ram.write_u32(
            area + offset_of!(VcpuArea, state) as u64,
            VcpuRunState::Running as u32,
        )?;
        // Activation ids start at 1; the boot activation of vCPU i is i + 1.
        ram.write_u32(area + offset_of!(VcpuArea, activation) as u64, i + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_nul_separated() {
        assert_eq!(pack_args(&["a".into(), "bc".into()]).unwrap(), b"a\0bc\0");
        assert!(pack_args(&["a\0b".into()]).is_err());
        assert!(pack_args(&["x".repeat(MAX_ARGS_LEN)]).is_err());
    }

    #[test]
    fn wall_clock_is_now() {
        let (ns, tsc) = wall_clock().unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(now.as_nanos() >= u128::from(ns));
        assert!(now.as_nanos() - u128::from(ns) < 1_000_000_000);
        assert!(tsc <= timestamp());
    }
}
