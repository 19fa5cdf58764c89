//! The inode flag ioctls (`FS_IOC_GETFLAGS`/`SETFLAGS`, `FS_IOC_FSGETXATTR`/`FSSETXATTR`),
//! which the kernel's fileattr hooks send as `FUSE_IOCTL` on a handle it opens read-only
//! for the purpose, and the statx attribute bits.

use cairn_fs::{FileAttributes, FsError};
use fuser::{Errno, Request};

use super::CairnFs;
use crate::convert::{credentials, holds_capability};
use crate::errno::ToErrno;
use crate::fileattr::{
    FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IOC32_GETFLAGS,
    FS_IOC32_SETFLAGS, Fsxattr, Refusal, flags_of, fsxattr_of, host_bytes, host_u32, with_flags,
    with_fsxattr,
};

/// CAP_LINUX_IMMUTABLE: sets and clears the immutable and append-only flags.
const CAP_LINUX_IMMUTABLE: u32 = 9;

/// What an ioctl answers: the out data, or the errno.
pub(super) type IoctlAnswer = Result<Vec<u8>, Errno>;

fn refusal(refusal: Refusal) -> Errno {
    Errno::from_i32(match refusal {
        Refusal::Unsupported => libc::EOPNOTSUPP,
        Refusal::Invalid => libc::EINVAL,
    })
}

impl CairnFs {
    /// Serves ioctl `cmd` on `inode` with input `input`; `ENOTTY` for commands other than
    /// the four flag ioctls (the kernel answers that to the caller).
    pub(super) fn serve_ioctl(
        &self,
        req: &Request,
        inode: u64,
        cmd: u32,
        input: &[u8],
    ) -> Result<IoctlAnswer, FsError> {
        let fs = self.fs()?;
        let report = fs.file_attributes(inode)?;
        let kind = fs.getattr(inode)?.kind;
        let current = report.attributes;
        let wanted: Result<FileAttributes, Refusal> = match cmd {
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => {
                return Ok(Ok(host_bytes(flags_of(&current.flags)).to_vec()));
            }
            FS_IOC_FSGETXATTR => return Ok(Ok(fsxattr_of(&report, kind).encode().to_vec())),
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => match input.get(..4).map(<[u8; 4]>::try_from) {
                Some(Ok(raw)) => with_flags(&current, host_u32(raw)),
                _ => Err(Refusal::Invalid),
            },
            FS_IOC_FSSETXATTR => match Fsxattr::decode(input) {
                Some(wanted) => with_fsxattr(&wanted, kind),
                None => Err(Refusal::Invalid),
            },
            _ => return Ok(Err(Errno::from_i32(libc::ENOTTY))),
        };
        let wanted = match wanted {
            Ok(wanted) => wanted,
            Err(why) => return Ok(Err(refusal(why))),
        };
        let who = credentials(req);
        let may_change_immutable = who.uid == 0 || holds_capability(req.pid(), CAP_LINUX_IMMUTABLE);
        match fs.set_file_attributes(inode, &wanted, &who, may_change_immutable) {
            Ok(()) => Ok(Ok(Vec::new())),
            Err(FsError::InvalidArgument(why)) => {
                tracing::debug!(inode, why, "inode attributes refused");
                Ok(Err(Errno::from_i32(libc::EINVAL)))
            }
            Err(error) => Ok(Err(error.to_errno())),
        }
    }
}
