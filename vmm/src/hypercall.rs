//! Handling vCPU exits: hypercalls (a load from the hypercall page, arguments in registers, see
//! `protocol::hypercall`) and every other exit, which ends the guest with a report. Every
//! argument is untrusted.

use std::sync::Arc;

use kvm_bindings::{kvm_mp_state, kvm_regs, KVM_MP_STATE_HALTED};
use kvm_ioctls::VcpuFd;
use protocol::blk::BLK_ERR_NO_DEVICE;
use protocol::hypercall::{decode, Hypercall, HC_UNSUPPORTED, MAX_WRITE_LEN};
use protocol::shared::UpcallKind;

use crate::activation::Event;
use crate::allocator::Slot;
use crate::arch::current::abi::HYPERCALL_BASE;
use crate::arch::current::vcpu::{dump, fatal_trap_report, hypercall_args};
use crate::devices::blk::{Op, Request};
use crate::guest::Guest;
use crate::vcpu::{Exit, EXIT_HYPERCALL, EXIT_OTHER};
use crate::vm::Outcome;

/// What the vCPU loop does after an exit.
#[derive(Debug)]
pub enum HcAction {
    Continue,
    /// The guest gave this vCPU's processor back (`sa_yield`).
    Yield,
    /// This vCPU is done; the guest goes on.
    StopVcpu,
    /// The whole guest is done.
    Finish(Outcome),
    /// A device request that must wait: the vCPU blocks in the VMM (see `vcpu.rs`); the
    /// load's result is set when the request completes.
    Block(Request),
}

fn violation(index: u32, fd: &VcpuFd, what: String) -> HcAction {
    HcAction::Finish(Outcome::fault(index, format!("{what}\n{}", dump(fd))))
}

/// Handle one exit of vCPU `index`.
pub fn handle_exit(fd: &mut VcpuFd, index: u32, guest: &Arc<Guest>, exit: Exit) -> HcAction {
    let count = |i: usize| {
        guest.vcpus[index as usize].exits[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
    match exit {
        Exit::MmioRead { addr, len } => {
            count(EXIT_HYPERCALL);
            let regs = fd.sync_regs().regs;
            match handle_load(fd, index, guest, addr, len, &regs) {
                Ok(value) => {
                    set_load_result(fd, value);
                    HcAction::Continue
                }
                Err(action) => action,
            }
        }
        Exit::MmioWrite { addr, len } => {
            count(EXIT_OTHER);
            let what = match decode(addr, HYPERCALL_BASE) {
                Some(_) => format!(
                    "malformed hypercall: a {len}-byte store to the hypercall page at {addr:#x} (hypercalls are loads)"
                ),
                None => format!("{len}-byte store to unbacked guest-physical address {addr:#x}: no device there"),
            };
            violation(index, fd, what)
        }
        Exit::Shutdown => violation(
            index,
            fd,
            format!("guest triple fault (KVM shutdown) on vCPU {index}"),
        ),
        Exit::InternalError => {
            let run = fd.get_kvm_run();
            // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, so `internal` is active.
            let suberror = unsafe { run.__bindgen_anon_1.internal.suberror };
            violation(
                index,
                fd,
                format!(
                    "KVM internal error (suberror {suberror}) on vCPU {index}: the guest ran an \
                     instruction KVM could not emulate (at CPL0: no SSE or xgetbv there)"
                ),
            )
        }
        Exit::FailEntry { reason } => violation(
            index,
            fd,
            format!("KVM could not enter vCPU {index} (hardware reason {reason:#x})"),
        ),
        Exit::Io { port } => violation(
            index,
            fd,
            format!("port I/O to {port:#x} on vCPU {index}: activm guests have no I/O ports"),
        ),
        Exit::Other(what) => violation(
            index,
            fd,
            format!("unexpected KVM exit {what} on vCPU {index}"),
        ),
    }
}

/// Set the result of the hypercall load the vCPU last exited on; KVM writes it to the load's
/// destination register when the vCPU next runs.
pub fn set_load_result(fd: &mut VcpuFd, value: u64) {
    // Only called after a KVM_EXIT_MMIO for a hypercall (`mmio` is the active union field) and
    // hypercall loads are 8 bytes (checked in `handle_load`).
    fd.get_kvm_run().__bindgen_anon_1.mmio.data = value.to_le_bytes();
}

/// Handle an MMIO load at `addr`; `Ok(value)` is the load's result.
fn handle_load(
    fd: &VcpuFd,
    index: u32,
    guest: &Arc<Guest>,
    addr: u64,
    len: usize,
    regs: &kvm_regs,
) -> Result<u64, HcAction> {
    let nr = match decode(addr, HYPERCALL_BASE) {
        None => {
            return Err(violation(index, fd, format!(
                "vCPU {index} read unbacked guest-physical address {addr:#x} (rip {:#x}): no device there",
                regs.rip
            )))
        }
        Some(Err(offset)) => {
            return Err(violation(index, fd, format!(
                "malformed hypercall on vCPU {index}: load at hypercall-page offset {offset:#x} is not 8-byte aligned"
            )))
        }
        Some(Ok(nr)) => nr,
    };
    if len != 8 {
        return Err(violation(index, fd, format!(
            "malformed hypercall {nr} on vCPU {index}: a {len}-byte load (hypercalls are 8-byte loads)"
        )));
    }
    let Some(call) = Hypercall::from_raw(nr) else {
        return Err(violation(
            index,
            fd,
            format!(
                "unknown hypercall {nr} on vCPU {index} (rip {:#x})",
                regs.rip
            ),
        ));
    };
    if let Some(trace) = &guest.trace {
        trace.instant(guest.id, index, call.name(), regs.rdi);
    }
    let [a0, a1, a2, a3] = hypercall_args(regs);
    match call {
        Hypercall::ConsoleWrite => {
            let bytes = read_buffer(guest, call, a0, a1).map_err(|e| violation(index, fd, e))?;
            guest.console_write(&bytes);
            Ok(a1)
        }
        Hypercall::Exit => Err(HcAction::Finish(Outcome::Exited((a0 & 0xff) as i32))),
        Hypercall::Panic => {
            let message = match read_buffer(guest, call, a0, a1) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => format!("<unreadable panic message: {e}>"),
            };
            Err(HcAction::Finish(Outcome::Panicked {
                vcpu: index,
                message,
            }))
        }
        Hypercall::FatalTrap => Err(HcAction::Finish(Outcome::Fault {
            vcpu: index,
            report: fatal_trap_report(fd, index, &guest.ram, regs),
        })),
        Hypercall::VcpuStop => Err(HcAction::StopVcpu),
        Hypercall::Halt => {
            // Sleep inside KVM until an interrupt is pending; KVM completes this load first.
            // With I/O completions due, this vCPU's thread may post them when they are.
            if let Some(disk) = &guest.disk {
                disk.queue.before_halt(index);
            }
            guest.vcpus[index as usize]
                .maybe_halted
                .store(true, std::sync::atomic::Ordering::Relaxed);
            fd.set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_HALTED,
            })
            .map_err(|e| violation(index, fd, format!("KVM_SET_MP_STATE(HALTED): {e}")))?;
            Ok(0)
        }
        Hypercall::SaRegister => {
            if !guest.acts.allowed() {
                return Ok(HC_UNSUPPORTED);
            }
            if !guest.plan.image.contains(&a0) {
                return Err(violation(index, fd, format!(
                    "malformed hypercall sa_register: upcall entry {a0:#x} lies outside the guest image"
                )));
            }
            guest.acts.register(a0);
            Ok(0)
        }
        Hypercall::SaEnable => match guest.acts.enable() {
            Ok(()) => {
                guest
                    .procs
                    .revoke(guest.procs.alloc.set_activations(guest.id, true));
                Ok(0)
            }
            Err(_) if !guest.acts.allowed() => Ok(HC_UNSUPPORTED),
            Err(why) => Err(violation(
                index,
                fd,
                format!("malformed hypercall sa_enable: {why}"),
            )),
        },
        Hypercall::SaSetConcurrency => {
            if !guest.acts.allowed() {
                return Ok(HC_UNSUPPORTED);
            }
            if a0 == 0 || a0 > guest.config.vcpus as u64 {
                return Err(violation(
                    index,
                    fd,
                    format!(
                        "malformed hypercall sa_setconcurrency({a0}): the guest has {} vCPUs",
                        guest.config.vcpus
                    ),
                ));
            }
            let (previous, kicks) = guest.procs.alloc.set_concurrency(guest.id, a0 as usize);
            guest.procs.revoke(kicks);
            Ok(previous as u64)
        }
        Hypercall::SaYield => {
            if !guest.acts.enabled() {
                return Ok(HC_UNSUPPORTED);
            }
            Err(HcAction::Yield)
        }
        Hypercall::SaPreempt => {
            if !guest.acts.enabled() {
                return Ok(HC_UNSUPPORTED);
            }
            let view = guest.procs.alloc.view(guest.id);
            match view.vcpus.get(a0 as usize) {
                Some(Slot::Running(_)) => {
                    let target = a0 as u32;
                    let event = Event::new(
                        UpcallKind::User,
                        guest.acts.current(target),
                        target,
                        index as u64,
                    );
                    guest.deliver(event);
                    Ok(0)
                }
                // Not running (or no such vCPU): nothing to interrupt.
                _ => Ok(1),
            }
        }
        Hypercall::BlkInfo => Ok(match &guest.disk {
            None => 0,
            Some(disk) => disk.info(a0).unwrap_or(HC_UNSUPPORTED),
        }),
        Hypercall::BlkRingSetup | Hypercall::BlkSubmit => {
            async_blk(fd, index, guest, call, [a0, a1, a2, a3])
        }
        Hypercall::BlkRead | Hypercall::BlkWrite | Hypercall::BlkFlush => {
            let Some(disk) = &guest.disk else {
                return Ok(BLK_ERR_NO_DEVICE);
            };
            let op = match call {
                Hypercall::BlkRead => Op::Read,
                Hypercall::BlkWrite => Op::Write,
                _ => Op::Flush,
            };
            let req = Request {
                op,
                sector: a0,
                gpa: a1,
                count: a2,
            };
            match disk.check(&guest.plan, &req) {
                Err(why) => Err(violation(
                    index,
                    fd,
                    format!("malformed hypercall {}: {why}", call.name()),
                )),
                Ok(Err(code)) => Ok(code),
                Ok(Ok(())) => match disk.try_now(&guest.ram, &req) {
                    Some(result) => Ok(result),
                    None => Err(HcAction::Block(req)),
                },
            }
        }
    }
}

/// `blk_ring_setup` and `blk_submit` (`devices/blk_async.rs`).
fn async_blk(
    fd: &VcpuFd,
    index: u32,
    guest: &Arc<Guest>,
    call: Hypercall,
    args: [u64; 4],
) -> Result<u64, HcAction> {
    let Some(disk) = &guest.disk else {
        return Ok(BLK_ERR_NO_DEVICE);
    };
    let done = match call {
        Hypercall::BlkRingSetup => disk.queue.setup(guest, args[0]),
        _ => disk.queue.submit(guest, args),
    };
    done.map_err(|why| {
        violation(
            index,
            fd,
            format!("malformed hypercall {}: {why}", call.name()),
        )
    })
}

fn read_buffer(guest: &Guest, call: Hypercall, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
    if len > MAX_WRITE_LEN {
        return Err(format!(
            "malformed hypercall {}: length {len} exceeds the limit of {MAX_WRITE_LEN}",
            call.name()
        ));
    }
    guest.ram.read_bytes(gpa, len).map_err(|e| {
        format!(
            "malformed hypercall {}: buffer {gpa:#x}+{len}: {e}",
            call.name()
        )
    })
}
