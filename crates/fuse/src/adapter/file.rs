//! Helpers for requests on open files: open flags and in-daemon range copies.

use cairn_fs::{FallocateMode, Filesystem, FsError, OpenMode, SeekKind, handle_is_direct};
use fuser::FopenFlags;

/// Largest range one copy_file_range request copies (the caller loops for the rest).
pub(super) const COPY_BYTES_MAX: u64 = 16 << 20;
/// Size of each read-then-write step of a copy.
const COPY_CHUNK_BYTES: u32 = 1 << 20;

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

/// Copies up to `len` bytes (at most `COPY_BYTES_MAX`) from one file to another inside
/// the daemon, sparing the data two trips through the kernel. Stops early at the source's
/// end; returns the bytes copied.
pub(super) fn copy_range(
    fs: &Filesystem,
    source: (u64, u64),
    target: (u64, u64),
    len: u64,
) -> Result<u32, FsError> {
    let (source_inode, mut source_offset) = source;
    let (target_inode, mut target_offset) = target;
    let mut left = len.min(COPY_BYTES_MAX);
    let mut copied = 0u64;
    while left > 0 {
        let step = left.min(u64::from(COPY_CHUNK_BYTES)) as u32;
        let data = fs.read(source_inode, source_offset, step)?;
        if data.is_empty() {
            break;
        }
        let written = fs.write(target_inode, target_offset, &data)?;
        copied += u64::from(written);
        if (written as usize) < data.len() {
            break;
        }
        source_offset += u64::from(written);
        target_offset += u64::from(written);
        left -= u64::from(written);
    }
    Ok(copied as u32)
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
