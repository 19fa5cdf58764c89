//! Helpers for requests on open files: open flags and in-daemon range copies.

use cairn_fs::{FallocateMode, Filesystem, FsError, OpenMode, SeekKind, handle_is_direct};
use fuser::FopenFlags;

/// Largest range one copy_file_range request copies by moving data (the caller loops for
/// the rest), so a request that copies stays short.
const COPY_BYTES_MAX: u64 = 16 << 20;
/// Largest range one copy_file_range request shares: the reply's byte count is 32 bits
/// (`fuse_write_out`), and the kernel asks for at most this much (a page-aligned `u32`).
const SHARE_BYTES_MAX: u64 = (u32::MAX - 0xfff) as u64;

/// The open mode of raw `open(2)` flags.
pub(super) fn open_mode(flags: i32) -> OpenMode {
    OpenMode {
        write: flags & libc::O_ACCMODE != libc::O_RDONLY,
        append: flags & libc::O_APPEND != 0,
        truncate: flags & libc::O_TRUNC != 0,
        direct: flags & libc::O_DIRECT != 0,
    }
}

/// Reply flags of an open by its handle: direct handles (`O_DIRECT`, or a writer of a file
/// with the sync flag) bypass the kernel's page cache (and may write in parallel: the
/// filesystem locks ranges itself); the others keep the cache across opens, as nothing but
/// this daemon changes the data.
pub(super) fn fopen_flags(handle: u64) -> FopenFlags {
    if handle_is_direct(handle) {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::FOPEN_KEEP_CACHE
    }
}

/// The filesystem mode of fallocate(2) mode bits; `None` for combinations it does not
/// offer (unshare, write zeroes, or a hole punch without KEEP_SIZE, which the kernel
/// refuses anyway).
pub(super) fn fallocate_mode(mode: i32) -> Option<FallocateMode> {
    let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 => Some(FallocateMode::Allocate { keep_size }),
        libc::FALLOC_FL_PUNCH_HOLE if keep_size => Some(FallocateMode::PunchHole),
        libc::FALLOC_FL_ZERO_RANGE => Some(FallocateMode::ZeroRange { keep_size }),
        // Linux takes these two alone (not with KEEP_SIZE). The kernel's FUSE does not
        // forward them as of 6.18 (`fuse_file_fallocate` refuses them itself).
        libc::FALLOC_FL_COLLAPSE_RANGE if !keep_size => Some(FallocateMode::CollapseRange),
        libc::FALLOC_FL_INSERT_RANGE if !keep_size => Some(FallocateMode::InsertRange),
        _ => None,
    }
}

/// The seek kind of an lseek whence; the kernel answers SEEK_SET, SEEK_CUR and SEEK_END
/// itself and forwards only these two.
pub(super) fn seek_kind(whence: i32) -> Option<SeekKind> {
    match whence {
        libc::SEEK_DATA => Some(SeekKind::Data),
        libc::SEEK_HOLE => Some(SeekKind::Hole),
        _ => None,
    }
}

/// `copy_file_range`: shares the blocks of the range where the filesystem can (reflink,
/// both offsets at the same place in a block; up to `SHARE_BYTES_MAX` a request) and copies
/// the rest inside the daemon, sparing the data two trips through the kernel (up to
/// `COPY_BYTES_MAX` a request). Stops early at the source's end; returns the bytes done.
pub(super) fn copy_range(
    fs: &Filesystem,
    (source, source_offset): (u64, u64),
    (target, target_offset): (u64, u64),
    len: u64,
) -> Result<u32, FsError> {
    let limit = match fs.copy_shares(source_offset, target_offset) {
        true => SHARE_BYTES_MAX,
        false => COPY_BYTES_MAX,
    };
    let done = fs.copy_file_range(source, source_offset, target, target_offset, len.min(limit))?;
    Ok(u32::try_from(done).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Access mode, O_APPEND, O_TRUNC and O_DIRECT are read from the flags; direct handles
    // skip the cache.
    #[test]
    fn open_flags_translate() {
        let read = open_mode(libc::O_RDONLY);
        assert_eq!(read, OpenMode::default());
        let write = open_mode(libc::O_WRONLY | libc::O_TRUNC | libc::O_DIRECT);
        assert!(write.write && write.truncate && write.direct && !write.append);
        assert!(open_mode(libc::O_RDWR).write);
        assert!(open_mode(libc::O_WRONLY | libc::O_APPEND).append);
        assert!(fopen_flags(0b11).contains(FopenFlags::FOPEN_DIRECT_IO));
        assert_eq!(fopen_flags(0b01), FopenFlags::FOPEN_KEEP_CACHE);
    }

    // fallocate(2) modes map to the filesystem's; unsupported ones are refused.
    #[test]
    fn fallocate_modes_translate() {
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(
            fallocate_mode(0),
            Some(FallocateMode::Allocate { keep_size: false })
        );
        assert_eq!(
            fallocate_mode(keep),
            Some(FallocateMode::Allocate { keep_size: true })
        );
        let punch = libc::FALLOC_FL_PUNCH_HOLE | keep;
        assert_eq!(fallocate_mode(punch), Some(FallocateMode::PunchHole));
        assert_eq!(fallocate_mode(libc::FALLOC_FL_PUNCH_HOLE), None);
        assert_eq!(
            fallocate_mode(libc::FALLOC_FL_ZERO_RANGE | keep),
            Some(FallocateMode::ZeroRange { keep_size: true })
        );
        assert_eq!(
            fallocate_mode(libc::FALLOC_FL_COLLAPSE_RANGE),
            Some(FallocateMode::CollapseRange)
        );
        assert_eq!(
            fallocate_mode(libc::FALLOC_FL_INSERT_RANGE),
            Some(FallocateMode::InsertRange)
        );
        assert_eq!(fallocate_mode(libc::FALLOC_FL_INSERT_RANGE | keep), None);
        assert_eq!(seek_kind(libc::SEEK_DATA), Some(SeekKind::Data));
        assert_eq!(seek_kind(libc::SEEK_HOLE), Some(SeekKind::Hole));
        assert_eq!(seek_kind(libc::SEEK_SET), None);
    }
}
