//! A hypercall, decoded once: which call the guest's load named (`protocol::hypercall`) and its
//! parameters, typed. The arguments come from the architecture's registers
//! (`arch::current::hypercall_args`); what each call does is `vcpu/hypercalls.rs`. Nothing
//! here is trusted yet: the handlers check every value against the guest.

use protocol::hypercall::{decode, Hypercall};

use crate::arch::current::abi::HYPERCALL_BASE;
use crate::devices::blk::{Op, Request};

/// A hypercall with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Write `len` bytes at guest-physical `buf` to the console.
    ConsoleWrite { buf: u64, len: u64 },
    /// End the guest with this exit status (its low byte).
    Exit { code: i32 },
    /// End the guest with the `len`-byte message at `buf`.
    Panic { buf: u64, len: u64 },
    /// The CPL0 stub met an exception it cannot handle; the trap frame is on its stack.
    FatalTrap,
    /// Stop this vCPU for good.
    VcpuStop,
    /// Sleep until an interrupt.
    Halt,
    /// Register the upcall entry point.
    SaRegister { entry: u64 },
    /// Start taking upcalls.
    SaEnable,
    /// Register the runtime's timeline rings (`protocol::timeline`).
    TimelineSetup { rings: u64, count: u64 },
    /// How many processors the guest can use.
    SaSetConcurrency { processors: u64 },
    /// Give this vCPU's processor back; with `wake_ns` > 0, ask for one back that much later.
    SaYield { wake_ns: u64 },
    /// Interrupt vCPU `vcpu` with a USER upcall.
    SaPreempt { vcpu: u64 },
    /// Ask the block device a question (`protocol::blk`).
    BlkInfo { what: u64 },
    /// Read, write or flush the block device.
    Blk(Request),
    /// Register the completion ring of asynchronous block requests (`protocol::blk::BlkRing`).
    BlkRingSetup { ring: u64 },
    /// Start an asynchronous block request: the raw `(sector, gpa, op << 32 | count, tag)`,
    /// checked by `devices/blk_async.rs`.
    BlkSubmit { args: [u64; 4] },
    /// Register the submission ring (`protocol::blk_submit::BlkSubmitRing`).
    BlkSubmitRingSetup { ring: u64 },
    /// Wake the submission ring's consumer (the doorbell through an exit).
    BlkDoorbell,
    /// A file call (`fs_*`, `devices/fs.rs`) with its raw arguments.
    Fs { args: [u64; 4] },
    /// A socket operation (`protocol::net`), checked by `devices/net.rs`.
    Net { args: [u64; 4] },
    /// Register the readiness ring of sockets (`protocol::net::NetRing`).
    NetRingSetup { ring: u64 },
}

/// A load that is not a well-formed hypercall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// A load from an address with nothing behind it.
    Unbacked { addr: u64 },
    /// A load inside the hypercall page, not at a call's 8-byte slot.
    Misaligned { offset: u64 },
    /// A hypercall load of the wrong width.
    Width { nr: u64, len: usize },
    /// A slot no hypercall has.
    Unknown { nr: u64 },
}

impl Call {
    /// Decode the `len`-byte load at guest-physical `addr` with the arguments `args` (read only
    /// when the address is a hypercall's).
    pub fn decode(
        addr: u64,
        len: usize,
        args: impl FnOnce() -> [u64; 4],
    ) -> Result<(Hypercall, Call), Malformed> {
        let nr = match decode(addr, HYPERCALL_BASE) {
            None => return Err(Malformed::Unbacked { addr }),
            Some(Err(offset)) => return Err(Malformed::Misaligned { offset }),
            Some(Ok(nr)) => nr,
        };
        if len != 8 {
            return Err(Malformed::Width { nr, len });
        }
        let kind = Hypercall::from_raw(nr).ok_or(Malformed::Unknown { nr })?;
        Ok((kind, Call::new(kind, args())))
    }

    /// The typed call `kind` with the raw arguments `a`.
    pub fn new(kind: Hypercall, a: [u64; 4]) -> Call {
        let blk = |op| {
            Call::Blk(Request {
                op,
                sector: a[0],
                gpa: a[1],
                count: a[2],
            })
        };
        match kind {
            Hypercall::ConsoleWrite => Call::ConsoleWrite {
                buf: a[0],
                len: a[1],
            },
            Hypercall::Exit => Call::Exit {
                code: (a[0] & 0xff) as i32,
            },
            Hypercall::Panic => Call::Panic {
                buf: a[0],
                len: a[1],
            },
            Hypercall::FatalTrap => Call::FatalTrap,
            Hypercall::VcpuStop => Call::VcpuStop,
            Hypercall::Halt => Call::Halt,
            Hypercall::SaRegister => Call::SaRegister { entry: a[0] },
            Hypercall::SaEnable => Call::SaEnable,
            Hypercall::TimelineSetup => Call::TimelineSetup {
                rings: a[0],
                count: a[1],
            },
            Hypercall::SaSetConcurrency => Call::SaSetConcurrency { processors: a[0] },
            Hypercall::SaYield => Call::SaYield { wake_ns: a[0] },
            Hypercall::SaPreempt => Call::SaPreempt { vcpu: a[0] },
            Hypercall::BlkInfo => Call::BlkInfo { what: a[0] },
            Hypercall::BlkRead => blk(Op::Read),
            Hypercall::BlkWrite => blk(Op::Write),
            Hypercall::BlkFlush => blk(Op::Flush),
            Hypercall::BlkRingSetup => Call::BlkRingSetup { ring: a[0] },
            Hypercall::BlkSubmit => Call::BlkSubmit { args: a },
            Hypercall::BlkSubmitRingSetup => Call::BlkSubmitRingSetup { ring: a[0] },
            Hypercall::BlkDoorbell => Call::BlkDoorbell,
            Hypercall::FsOpen
            | Hypercall::FsClose
            | Hypercall::FsRead
            | Hypercall::FsWrite
            | Hypercall::FsSeek
            | Hypercall::FsFstat
            | Hypercall::FsStat
            | Hypercall::FsGetdents
            | Hypercall::FsMkdir
            | Hypercall::FsUnlink
            | Hypercall::FsRename
            | Hypercall::FsFsync => Call::Fs { args: a },
            Hypercall::Net => Call::Net { args: a },
            Hypercall::NetRingSetup => Call::NetRingSetup { ring: a[0] },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(kind: Hypercall) -> u64 {
        HYPERCALL_BASE + 8 * kind as u64
    }

    #[test]
    fn decodes_typed_parameters() {
        let args = || [7, 0x1000, 3, 0];
        assert_eq!(
            Call::decode(slot(Hypercall::BlkWrite), 8, args),
            Ok((
                Hypercall::BlkWrite,
                Call::Blk(Request {
                    op: Op::Write,
                    sector: 7,
                    gpa: 0x1000,
                    count: 3
                })
            ))
        );
        assert_eq!(
            Call::decode(slot(Hypercall::Exit), 8, || [0x1ff, 0, 0, 0]).map(|(_, c)| c),
            Ok(Call::Exit { code: 0xff })
        );
    }

    #[test]
    fn rejects_what_is_no_hypercall() {
        let args = || unreachable!("no arguments for a malformed call");
        assert_eq!(
            Call::decode(0x1000, 8, args),
            Err(Malformed::Unbacked { addr: 0x1000 })
        );
        assert_eq!(
            Call::decode(HYPERCALL_BASE + 4, 8, args),
            Err(Malformed::Misaligned { offset: 4 })
        );
        assert_eq!(
            Call::decode(slot(Hypercall::Halt), 4, args),
            Err(Malformed::Width {
                nr: Hypercall::Halt as u64,
                len: 4
            })
        );
        assert_eq!(
            Call::decode(HYPERCALL_BASE + 8 * 511, 8, args),
            Err(Malformed::Unknown { nr: 511 })
        );
    }
}
