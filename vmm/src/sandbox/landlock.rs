//! Landlock: after setup, a thread may open only the files activm was given (guest images and
//! the configuration to read, disks to read and write, the trace file to write, the trees of
//! `--mount` directories) and create or
//! remove only the control socket in its directory. Where the kernel lacks Landlock, nothing
//! is confined and the main thread says so.

use std::path::PathBuf;

use landlock::{
    Access as _, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};

/// What the VMM may still do with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
    Write,
    /// A directory where the control socket is made and removed.
    SocketDir,
    /// A mounted directory tree, read-only (`--mount ...:ro`).
    Tree,
    /// A mounted directory tree: read, write, create, remove and rename in it.
    TreeWrite,
}

/// How far Landlock confines this thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LandlockStatus {
    Enforced,
    Partial,
    Unavailable(String),
}

/// The newest ABI activm knows; older kernels get what they support (best effort).
const ABI_USED: ABI = ABI::V5;

fn rights(access: Access) -> BitFlags<AccessFs> {
    let file_read = AccessFs::ReadFile.into();
    let file_write = AccessFs::WriteFile | AccessFs::Truncate;
    match access {
        Access::Read => file_read,
        Access::ReadWrite => file_read | file_write,
        Access::Write => file_write,
        Access::SocketDir => AccessFs::MakeSock | AccessFs::RemoveFile,
        Access::Tree => file_read | AccessFs::ReadDir,
        Access::TreeWrite => {
            file_read
                | file_write
                | AccessFs::ReadDir
                | AccessFs::MakeDir
                | AccessFs::MakeReg
                | AccessFs::RemoveDir
                | AccessFs::RemoveFile
                | AccessFs::Refer
        }
    }
}

/// Restrict the calling thread (and the threads it starts) to `paths`.
pub fn restrict(paths: &[(PathBuf, Access)]) -> LandlockStatus {
    let attempt = || -> Result<RulesetStatus, landlock::RulesetError> {
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI_USED))?
            .create()?;
        for (path, access) in paths {
            // A path that is gone is simply not allowed.
            if let Ok(fd) = PathFd::new(path) {
                ruleset = ruleset.add_rule(PathBeneath::new(fd, rights(*access)))?;
            }
        }
        Ok(ruleset.restrict_self()?.ruleset)
    };
    match attempt() {
        Ok(RulesetStatus::FullyEnforced) => LandlockStatus::Enforced,
        Ok(RulesetStatus::PartiallyEnforced) => LandlockStatus::Partial,
        Ok(RulesetStatus::NotEnforced) => {
            LandlockStatus::Unavailable("the kernel does not enforce it".into())
        }
        Err(e) => LandlockStatus::Unavailable(e.to_string()),
    }
}
