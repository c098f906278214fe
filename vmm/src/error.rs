//! Errors of the VMM itself: bad input and host failures. What the *guest* does wrong is an
//! [`crate::vm::Outcome`], not an `Error`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open /dev/kvm: {0} (is KVM available here, and may this user use it?)")]
    KvmUnavailable(std::io::Error),
    #[error("KVM lacks a capability activm needs: {0}")]
    KvmCapability(&'static str),
    #[error("KVM: {what}: {source}")]
    Kvm {
        what: &'static str,
        source: vmm_sys_util::errno::Error,
    },
    #[error("cannot read guest image {path}: {source}")]
    ImageRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an ELF file")]
    NotElf { path: PathBuf },
    #[error("{path}: unusable ELF: {reason}")]
    BadElf { path: PathBuf, reason: String },
    #[error("{path}: ELF built for {found}, but this activm runs {expected} guests")]
    WrongArch {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: no activm boot header at {addr:#x}: not an activm guest")]
    NoBootHeader { path: PathBuf, addr: u64 },
    #[error("{path}: guest built for activm ABI v{guest}, this activm speaks ABI v{vmm}; rebuild the guest")]
    AbiMismatch { path: PathBuf, guest: u32, vmm: u32 },
    #[error("guest memory too small: the image, boot stacks and a minimal heap need {needed:#x} bytes, --mem gives {given:#x}")]
    MemTooSmall { needed: u64, given: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("guest memory: {0}")]
    Memory(String),
    #[error("host: {0}")]
    Host(String),
}

impl Error {
    pub fn kvm(what: &'static str) -> impl FnOnce(vmm_sys_util::errno::Error) -> Error {
        move |source| Error::Kvm { what, source }
    }
}
