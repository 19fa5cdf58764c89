//! The `fuser::Filesystem` implementation: each request is timed, translated, served by
//! `cairn_fs::Filesystem` and answered. Node ids are the filesystem's inode numbers, except
//! that FUSE's root id 1 stands for the filesystem's root inode (an inode number that can
//! never be 1: block 0 holds the superblock).

mod dir;
mod file;
mod fileattr;
mod init;
mod node;
mod ops;
mod xattr;

pub use xattr::{GROW_XATTR_PREFIX, SYNC_XATTR, TRIM_XATTR_PREFIX};

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_fs::{Attr, FsError};
use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, ReplyEntry};

use crate::convert::file_attr;
use crate::core::{CoreRef, CoreSlot};
use crate::errno::{ToErrno, is_severe};
use crate::options::FuseSettings;
use crate::stats::{Op, RequestStats};

/// FUSE's node id of the root directory.
pub const FUSE_ROOT_ID: u64 = 1;

/// The FUSE front end of one mounted filesystem.
#[derive(Debug)]
pub struct CairnFs {
    core: Arc<CoreSlot>,
    requests: Arc<RequestStats>,
    settings: FuseSettings,
    read_only: bool,
    root: u64,
    /// The io_uring transport's side of the handshake, if it was prepared.
    ring: Option<Arc<crate::uring::RingOffer>>,
    /// Reads may be answered after their handler returned (`Filesystem::read_handed_over`):
    /// true on `/dev/fuse`, whose replies any thread may send; a ring entry takes its reply
    /// only while its handler runs.
    hand_over_reads: bool,
}

impl CairnFs {
    /// A front end serving the filesystem in `core` (mounted), counting requests in
    /// `requests`.
    pub fn new(
        core: Arc<CoreSlot>,
        requests: Arc<RequestStats>,
        settings: FuseSettings,
        read_only: bool,
    ) -> Result<Self, FsError> {
        let root = core.get()?.root();
        debug_assert_ne!(
            root, FUSE_ROOT_ID,
            "inode 1 cannot exist: block 0 is the superblock"
        );
        Ok(Self {
            core,
            requests,
            settings,
            read_only,
            root,
            ring: None,
            hand_over_reads: true,
        })
    }

    /// This front end negotiates the io_uring transport at init as `offer` says.
    pub fn with_ring(mut self, offer: Arc<crate::uring::RingOffer>) -> Self {
        self.ring = Some(offer);
        self
    }

    /// This front end answers every read before its handler returns (for a ring
    /// transport's dispatcher).
    pub fn with_reads_answered_in_handler(mut self) -> Self {
        self.hand_over_reads = false;
        self
    }

    /// The filesystem, for the length of one call (`ShutDown` once it was unmounted).
    fn fs(&self) -> Result<CoreRef<'_>, FsError> {
        self.core.get()
    }

    /// Drops `count` lookup references of `inode` (nothing once unmounted).
    fn drop_reference(&self, inode: u64, count: u64) {
        if let Ok(fs) = self.fs() {
            fs.forget(inode, count);
        }
    }

    /// The filesystem inode a FUSE node id names.
    fn inode(&self, node: INodeNo) -> u64 {
        match node.0 {
            FUSE_ROOT_ID => self.root,
            inode => inode,
        }
    }

    /// The FUSE node id of a filesystem inode.
    fn node(&self, inode: u64) -> INodeNo {
        INodeNo(if inode == self.root {
            FUSE_ROOT_ID
        } else {
            inode
        })
    }

    /// FUSE attributes of `attr`, with the root's node id mapped.
    fn fuse_attr(&self, attr: &Attr) -> FileAttr {
        let mut out = file_attr(attr);
        out.ino = self.node(attr.inode);
        out
    }

    /// Counts and logs a failed request and returns its errno.
    fn fail(&self, op: Op, error: &FsError) -> Errno {
        failed(&self.requests, op, error)
    }

    /// Counts a request refused before it reached the filesystem.
    fn refuse(&self, op: Op, errno: Errno) -> Errno {
        self.requests.error(op);
        errno
    }

    /// Answers with an entry the kernel may cache for the entry timeout.
    fn reply_entry(&self, reply: ReplyEntry, attr: &Attr) {
        let generation = Generation(u64::from(attr.generation));
        reply.entry_with_ttls(
            &self.settings.attr_timeout,
            &self.settings.entry_timeout,
            &self.fuse_attr(attr),
            generation,
        );
    }

    /// Answers a lookup of a missing name with a negative entry (node id 0), which the
    /// kernel caches for the entry timeout: every creation goes through this daemon, so
    /// the kernel learns of new names itself.
    fn reply_negative(&self, reply: ReplyEntry) {
        if self.settings.entry_timeout.is_zero() {
            reply.error(Errno::from_i32(libc::ENOENT));
            return;
        }
        let attr = FileAttr {
            ino: INodeNo(0),
            size: 0,
            blocks: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
            flags: 0,
        };
        reply.entry_with_ttls(
            &Duration::ZERO,
            &self.settings.entry_timeout,
            &attr,
            Generation(0),
        );
    }
}

/// Counts and logs a failed request in `requests` and returns its errno.
fn failed(requests: &RequestStats, op: Op, error: &FsError) -> Errno {
    requests.error(op);
    if is_severe(error) {
        tracing::error!(request = ?op, %error, "request failed");
    } else {
        tracing::debug!(request = ?op, %error, "request failed");
    }
    error.to_errno()
}
