//! cairn patch (CAIRN-PATCH.md item 6): the reply to `FUSE_STATX` (Linux 6.6+, protocol
//! 7.39), which carries the birth time and the statx attribute bits a plain `FUSE_GETATTR`
//! reply has no room for.

use std::time::Duration;
use std::time::SystemTime;

use crate::Errno;
use crate::FileAttr;
use crate::ll;
use crate::ll::fuse_abi as abi;
use crate::ll::reply::mode_from_kind_and_perm;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::time::time_from_system_time;

/// `STATX_BASIC_STATS`: type, mode, nlink, uid, gid, times, ino, size, blocks.
const STATX_BASIC_STATS: u32 = 0x7ff;
/// `STATX_BTIME`: the birth time.
const STATX_BTIME: u32 = 0x800;

/// The reply to a statx request.
#[derive(Debug)]
pub struct ReplyStatx {
    reply: ReplyRaw,
}

impl Reply for ReplyStatx {
    fn new(unique: ll::RequestId, sender: ReplySender) -> ReplyStatx {
        ReplyStatx {
            reply: Reply::new(unique, sender),
        }
    }
}

impl ReplyStatx {
    /// Replies with `attr` (its `crtime` as the birth time) and the statx attribute bits
    /// `attributes` (`STATX_ATTR_*`), of which `attributes_mask` says which the filesystem
    /// supports; the kernel may cache it all for `ttl`.
    pub fn statx(self, ttl: &Duration, attr: &FileAttr, attributes: u64, attributes_mask: u64) {
        let (rdev_major, rdev_minor) = decode_dev(attr.rdev);
        let stat = abi::fuse_statx {
            mask: STATX_BASIC_STATS | STATX_BTIME,
            blksize: attr.blksize,
            attributes,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            mode: mode_from_kind_and_perm(attr.kind, attr.perm) as u16,
            spare0: [0],
            ino: attr.ino.0,
            size: attr.size,
            blocks: attr.blocks,
            attributes_mask,
            atime: sx_time(&attr.atime),
            btime: sx_time(&attr.crtime),
            ctime: sx_time(&attr.ctime),
            mtime: sx_time(&attr.mtime),
            rdev_major,
            rdev_minor,
            dev_major: 0,
            dev_minor: 0,
            spare2: [0; 14],
        };
        let out = abi::fuse_statx_out {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            flags: 0,
            spare: [0; 2],
            stat,
        };
        self.reply.send_ll(&ll::ResponseStruct(out));
    }

    /// Replies with the given error code (`ENOSYS`: the kernel stops sending statx and
    /// asks with getattr instead).
    pub fn error(self, err: Errno) {
        self.reply.error(err);
    }
}

fn sx_time(time: &SystemTime) -> abi::fuse_sx_time {
    let (tv_sec, tv_nsec) = time_from_system_time(time);
    abi::fuse_sx_time {
        tv_sec,
        tv_nsec,
        reserved: 0,
    }
}

/// Major and minor of a device number in the kernel's `new_encode_dev` form (what a
/// `FUSE_MKNOD` request carries and `fuse_attr.rdev` holds).
fn decode_dev(dev: u32) -> (u32, u32) {
    ((dev >> 8) & 0xfff, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

#[cfg(test)]
mod test {
    use super::decode_dev;

    #[test]
    fn device_numbers_decode() {
        // MKDEV(1, 3) and MKDEV(7, 123), and a minor above 255.
        assert_eq!(decode_dev(0x103), (1, 3));
        assert_eq!(decode_dev(0x77b), (7, 123));
        assert_eq!(decode_dev((0x12 << 8) | 0x34 | (0x56000 << 12)), (0x12, 0x56034));
    }
}
