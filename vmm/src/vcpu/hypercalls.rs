//! The hypercalls: decoded once into a typed [`Call`] (the arguments read from the registers by
//! the architecture), then one handler per call. A handler's `Ok(value)` is the load's result;
//! `Err(action)` is what the run loop does instead. Every argument is untrusted.

use std::sync::atomic::Ordering;

use protocol::blk::BLK_ERR_NO_DEVICE;
use protocol::hypercall::{Hypercall, HC_UNSUPPORTED, MAX_WRITE_LEN};
use protocol::shared::UpcallKind;

use super::{ExitAction, VcpuThread};
use crate::activation::Event;
use crate::allocator::Slot;
use crate::arch::current as arch;
use crate::devices::blk::Request;
use crate::devices::blk_async::queue::AsyncQueue;
use crate::devices::fs::{Answer, GuestMem};
use crate::devices::Blocking;
use crate::hypercall::{Call, Malformed};
use crate::memory::{GuestRam, Plan};
use crate::vm::Outcome;

/// A handler's result: the load's value, or what the run loop does instead.
type Handled = Result<u64, ExitAction>;

impl VcpuThread {
    /// The `len`-byte load at guest-physical `addr`: decode it, trace it, run its handler and
    /// set its result.
    pub(super) fn hypercall(&mut self, addr: u64, len: usize) -> ExitAction {
        let fd = &self.fd;
        let (kind, call) = match Call::decode(addr, len, || arch::hypercall_args(fd)) {
            Ok(decoded) => decoded,
            Err(malformed) => return self.malformed(malformed),
        };
        // An exit the VMM looks at the disk's submission ring from (one load if empty). After
        // these three the vCPU goes to its scheduler, which takes the completion ring.
        if let Some(disk) = &self.guest.disk {
            let to_scheduler = matches!(
                call,
                Call::BlkSubmit { .. } | Call::BlkDoorbell | Call::Halt
            );
            if let Err(why) = disk.queue.look_at_exit(&self.guest, to_scheduler) {
                return self.violation(why);
            }
        }
        if let Some(trace) = &self.guest.trace {
            let first_arg = arch::hypercall_args(&self.fd)[0];
            trace.instant(self.guest.id, self.index, kind.name(), first_arg);
        }
        match self.dispatch(kind, call) {
            Ok(value) => {
                arch::set_hypercall_result(&mut self.fd, value);
                ExitAction::Continue
            }
            Err(action) => action,
        }
    }

    fn malformed(&self, malformed: Malformed) -> ExitAction {
        let index = self.index;
        self.violation(match malformed {
            Malformed::Unbacked { addr } => format!(
                "vCPU {index} read unbacked guest-physical address {addr:#x} ({}): no device there",
                arch::describe_pc(&self.fd)
            ),
            Malformed::Misaligned { offset } => format!(
                "malformed hypercall on vCPU {index}: load at hypercall-page offset {offset:#x} is not 8-byte aligned"
            ),
            Malformed::Width { nr, len } => format!(
                "malformed hypercall {nr} on vCPU {index}: a {len}-byte load (hypercalls are 8-byte loads)"
            ),
            Malformed::Unknown { nr } => format!(
                "unknown hypercall {nr} on vCPU {index} ({})",
                arch::describe_pc(&self.fd)
            ),
        })
    }

    fn dispatch(&mut self, kind: Hypercall, call: Call) -> Handled {
        match call {
            Call::ConsoleWrite { buf, len } => self.console_write(kind, buf, len),
            Call::Exit { code } => {
                if let Some(net) = &self.guest.net {
                    // Bytes queued in transmit rings go out, as a process's would at exit.
                    net.flush_at_exit(&self.guest.ram);
                }
                Err(ExitAction::Finish(Outcome::Exited(code)))
            }
            Call::Panic { buf, len } => self.panic(kind, buf, len),
            Call::FatalTrap => Err(ExitAction::Finish(Outcome::Fault {
                vcpu: self.index,
                report: arch::fatal_trap_report(&self.fd, self.index, &self.guest.ram),
            })),
            Call::VcpuStop => Err(ExitAction::Stop),
            Call::Halt => self.halt(),
            Call::SaRegister { entry } => self.sa_register(entry),
            Call::SaEnable => self.sa_enable(),
            Call::TimelineSetup { rings, count } => self.timeline_setup(kind, rings, count),
            Call::SaSetConcurrency { processors } => self.sa_setconcurrency(processors),
            Call::SaYield { wake_ns } => self.sa_yield(wake_ns),
            Call::SaPreempt { vcpu } => self.sa_preempt(vcpu),
            Call::BlkInfo { what } => Ok(match &self.guest.disk {
                None => 0,
                Some(disk) => disk.info(what).unwrap_or(HC_UNSUPPORTED),
            }),
            Call::Blk(req) => self.blk(kind, req),
            Call::BlkRingSetup { ring } => {
                self.blk_async(kind, |queue| queue.setup(&self.guest, ring))
            }
            Call::BlkSubmit { args } => {
                self.blk_async(kind, |queue| queue.submit(&self.guest, args))
            }
            Call::BlkSubmitRingSetup { ring } => {
                self.blk_async(kind, |queue| queue.setup_submit_ring(&self.guest, ring))
            }
            // The exit took the ring (`hypercall`): what is due goes out, no consumer wakes.
            Call::BlkDoorbell => self.blk_async(kind, |queue| {
                queue.post_due_at_exit(&self.guest);
                Ok(0)
            }),
            Call::Fs { args } => self.fs(kind, args),
            Call::Net { args } => self.net(kind, |net| {
                net.call(&self.guest.ram, &self.guest.plan, args)
            }),
            Call::NetRingSetup { ring } => self.net(kind, |net| {
                net.setup(&self.guest.ram, &self.guest.plan, ring)
            }),
        }
    }

    /// `blk_ring_setup` and `blk_submit` (`devices/blk_async.rs`; `Err` there is a violation).
    fn blk_async(
        &self,
        kind: Hypercall,
        call: impl FnOnce(&AsyncQueue) -> Result<u64, String>,
    ) -> Handled {
        let Some(disk) = &self.guest.disk else {
            return Ok(BLK_ERR_NO_DEVICE);
        };
        call(&disk.queue)
            .map_err(|why| self.violation(format!("malformed hypercall {}: {why}", kind.name())))
    }

    /// A file call (`devices/fs.rs`): done inside the exit, or the vCPU blocks on its slow
    /// part; `Err` there is a violation.
    fn fs(&self, kind: Hypercall, args: [u64; 4]) -> Handled {
        let mem = GuestMem {
            ram: &self.guest.ram,
            plan: &self.guest.plan,
        };
        match self.guest.files.start(&mem, kind, args) {
            Ok(Answer::Now(result)) => Ok(result as u64),
            Ok(Answer::Slow(slow)) => Err(ExitAction::Block(Blocking::File(slow))),
            Err(why) => Err(self.violation(format!("malformed hypercall {}: {why}", kind.name()))),
        }
    }

    /// `net` and `net_ring_setup` (`devices/net.rs`; `Err` there is a violation). Without
    /// `--publish` or `--allow-connect` every call is `-EACCES`.
    fn net(
        &self,
        kind: Hypercall,
        call: impl FnOnce(&crate::devices::net::Net) -> Result<u64, String>,
    ) -> Handled {
        let Some(net) = &self.guest.net else {
            return Ok((-(libc::EACCES as i64)) as u64);
        };
        let result = call(net)
            .map_err(|why| self.violation(format!("malformed hypercall {}: {why}", kind.name())));
        crate::devices::net::thread::after_call(&self.guest);
        result
    }

    /// `timeline_setup(gpa, nr_rings)` (`timeline.rs`): only when a trace is recorded (the
    /// guest saw `SHARED_FEATURE_TIMELINE`); otherwise, or malformed, a violation.
    fn timeline_setup(&self, kind: Hypercall, rings: u64, count: u64) -> Handled {
        let (Some(timeline), Some(trace)) = (&self.guest.timeline, &self.guest.trace) else {
            return Err(self.violation(format!(
                "malformed hypercall {}: no trace is recorded (SHARED_FEATURE_TIMELINE is off)",
                kind.name()
            )));
        };
        timeline
            .setup(
                &self.guest.ram,
                self.guest.plan.image.start,
                trace,
                self.guest.id,
                rings,
                count,
            )
            .map_err(|why| self.violation(format!("malformed hypercall {}: {why}", kind.name())))
    }

    fn console_write(&self, kind: Hypercall, buf: u64, len: u64) -> Handled {
        let bytes = self
            .read_buffer(kind, buf, len)
            .map_err(|e| self.violation(e))?;
        self.guest.console_write(&bytes);
        Ok(len)
    }

    fn panic(&self, kind: Hypercall, buf: u64, len: u64) -> Handled {
        let message = match self.read_buffer(kind, buf, len) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("<unreadable panic message: {e}>"),
        };
        Err(ExitAction::Finish(Outcome::Panicked {
            vcpu: self.index,
            message,
        }))
    }

    /// Sleep inside KVM until an interrupt is pending; KVM completes this load first.
    fn halt(&self) -> Handled {
        // I/O completions due now go out and the vCPU runs on to take them; with some due
        // later, this vCPU's thread may post them when they are.
        if let Some(disk) = &self.guest.disk {
            if disk.queue.before_halt(&self.guest, self.index) {
                return Ok(0);
            }
        }
        self.control.maybe_halted.store(true, Ordering::Relaxed);
        arch::halt(&self.fd)
            .map_err(|e| self.violation(format!("KVM_SET_MP_STATE(HALTED): {e}")))?;
        Ok(0)
    }

    fn sa_register(&self, entry: u64) -> Handled {
        if !self.guest.acts.allowed() {
            return Ok(HC_UNSUPPORTED);
        }
        if !self.guest.plan.image.contains(&entry) {
            return Err(self.violation(format!(
                "malformed hypercall sa_register: upcall entry {entry:#x} lies outside the guest image"
            )));
        }
        self.guest.acts.register(entry);
        Ok(0)
    }

    fn sa_enable(&self) -> Handled {
        let guest = &self.guest;
        match guest.acts.enable() {
            Ok(()) => {
                guest
                    .procs
                    .revoke(guest.procs.alloc.set_activations(guest.id, true));
                Ok(0)
            }
            Err(_) if !guest.acts.allowed() => Ok(HC_UNSUPPORTED),
            Err(why) => Err(self.violation(format!("malformed hypercall sa_enable: {why}"))),
        }
    }

    fn sa_setconcurrency(&self, processors: u64) -> Handled {
        let guest = &self.guest;
        if !guest.acts.allowed() {
            return Ok(HC_UNSUPPORTED);
        }
        if processors == 0 || processors > guest.config.vcpus as u64 {
            return Err(self.violation(format!(
                "malformed hypercall sa_setconcurrency({processors}): the guest has {} vCPUs",
                guest.config.vcpus
            )));
        }
        guest.stats.asks.fetch_add(1, Ordering::Relaxed);
        let (previous, kicks) = guest
            .procs
            .alloc
            .set_concurrency(guest.id, processors as usize);
        guest.procs.revoke(kicks);
        Ok(previous as u64)
    }

    fn sa_yield(&self, wake_ns: u64) -> Handled {
        if !self.guest.acts.enabled() {
            return Ok(HC_UNSUPPORTED);
        }
        // With block requests in flight or sockets that may wait (`SHARED_FEATURE_YIELD_NET`),
        // a processor nobody else wants (or a latency-critical guest's last one) is better
        // kept: the vCPU halts until the completion or report instead of a new activation for
        // it.
        let io_in_flight = self.guest.net.is_some()
            || self
                .guest
                .disk
                .as_ref()
                .is_some_and(|disk| disk.queue.in_flight() > 0);
        if io_in_flight
            && self
                .guest
                .procs
                .alloc
                .keeps_processor_for_io(self.guest.id, self.index as usize)
        {
            self.guest
                .stats
                .offers_declined
                .fetch_add(1, Ordering::Relaxed);
            return Ok(protocol::hypercall::SA_YIELD_DECLINED);
        }
        // A wake-up asked for more than a second ahead is clamped (the guest asks again).
        Err(ExitAction::Yield {
            wake_ns: wake_ns.min(1_000_000_000),
        })
    }

    /// A USER upcall to vCPU `target`, if it runs; 1 if it does not (nothing to interrupt).
    fn sa_preempt(&self, target: u64) -> Handled {
        let guest = &self.guest;
        if !guest.acts.enabled() {
            return Ok(HC_UNSUPPORTED);
        }
        let view = guest.procs.alloc.view(guest.id);
        match view.vcpus.get(target as usize) {
            Some(Slot::Running(_)) => {
                let target = target as u32;
                let event = Event::new(
                    UpcallKind::User,
                    guest.acts.current(target),
                    target,
                    self.index as u64,
                );
                guest.deliver(event);
                Ok(0)
            }
            _ => Ok(1),
        }
    }

    /// A block request: done now if it can be (within the disk's inline wait), else the vCPU
    /// blocks on what is left of it.
    fn blk(&self, kind: Hypercall, req: Request) -> Handled {
        let Some(disk) = &self.guest.disk else {
            return Ok(BLK_ERR_NO_DEVICE);
        };
        match disk.check(&self.guest.plan, &req) {
            Err(why) => Err(self.violation(format!("malformed hypercall {}: {why}", kind.name()))),
            Ok(Err(code)) => Ok(code),
            Ok(Ok(())) => disk
                .start(&self.guest.ram, &req)
                .map_err(|p| ExitAction::Block(Blocking::Disk(p))),
        }
    }

    fn read_buffer(&self, kind: Hypercall, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
        read_buffer(&self.guest.ram, &self.guest.plan, kind, gpa, len)
    }
}

/// The `len`-byte buffer at guest-physical `gpa` that hypercall `kind` names (console text, a
/// panic message): at most `MAX_WRITE_LEN` bytes, inside guest RAM and not in the VMM's pages.
pub fn read_buffer(
    ram: &GuestRam,
    plan: &Plan,
    kind: Hypercall,
    gpa: u64,
    len: u64,
) -> Result<Vec<u8>, String> {
    if len > MAX_WRITE_LEN {
        return Err(format!(
            "malformed hypercall {}: length {len} exceeds the limit of {MAX_WRITE_LEN}",
            kind.name()
        ));
    }
    // Not the VMM's supervisor-only pages (GDT, IDT, page tables, CPL0 stacks): the guest
    // cannot read them itself, so no hypercall copies them out for it.
    let end = gpa.saturating_add(len);
    let low = &arch::layout::USER_LOW;
    if gpa < plan.image.start && !(low.start <= gpa && end <= low.end) {
        return Err(format!(
            "malformed hypercall {}: buffer {gpa:#x}+{len} lies in the VMM's pages below the \
             image ({:#x}), which the guest cannot read",
            kind.name(),
            plan.image.start
        ));
    }
    ram.read_bytes(gpa, len).map_err(|e| {
        format!(
            "malformed hypercall {}: buffer {gpa:#x}+{len}: {e}",
            kind.name()
        )
    })
}
