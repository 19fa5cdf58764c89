//! The one mapping from filesystem errors to errno values.

use cairn_fs::FsError;
use fuser::Errno;

/// Conversion of an error into the errno the kernel passes back to the caller.
pub trait ToErrno {
    /// The errno for this error.
    fn to_errno(&self) -> Errno;
}

impl ToErrno for FsError {
    fn to_errno(&self) -> Errno {
        Errno::from_i32(errno_code(self))
    }
}

/// The raw errno value of `error`.
pub fn errno_code(error: &FsError) -> i32 {
    match error {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDirectory => libc::ENOTDIR,
        FsError::IsDirectory => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::InvalidName | FsError::InvalidArgument(_) => libc::EINVAL,
        FsError::NoSpace => libc::ENOSPC,
        FsError::PermissionDenied => libc::EACCES,
        FsError::NotPermitted => libc::EPERM,
        FsError::ReadOnly => libc::EROFS,
        FsError::CrossDevice => libc::EXDEV,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::NoData => libc::ENODATA,
        FsError::Range => libc::ERANGE,
        FsError::FileTooBig => libc::EFBIG,
        // EUCLEAN is what XFS and ext4 return for detected corruption (EFSCORRUPTED).
        FsError::Corrupt { .. } => libc::EUCLEAN,
        FsError::Io { .. } | FsError::ShutDown => libc::EIO,
        FsError::Unsupported | FsError::UnsupportedFeatures { .. } => libc::EOPNOTSUPP,
        // SEEK_DATA / SEEK_HOLE at or past the end, or no data after the offset.
        FsError::NoSuchOffset => libc::ENXIO,
        _ => libc::EIO,
    }
}

/// Whether `error` means the filesystem is damaged or stopped (logged at error level).
pub fn is_severe(error: &FsError) -> bool {
    matches!(
        error,
        FsError::Corrupt { .. } | FsError::Io { .. } | FsError::ShutDown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each plain variant maps to its POSIX errno; corruption maps to EUCLEAN.
    #[test]
    fn variants_map_to_posix_errnos() {
        let cases = [
            (FsError::NotFound, libc::ENOENT),
            (FsError::Exists, libc::EEXIST),
            (FsError::NotDirectory, libc::ENOTDIR),
            (FsError::IsDirectory, libc::EISDIR),
            (FsError::NotEmpty, libc::ENOTEMPTY),
            (FsError::NameTooLong, libc::ENAMETOOLONG),
            (FsError::NoSpace, libc::ENOSPC),
            (FsError::PermissionDenied, libc::EACCES),
            (FsError::NotPermitted, libc::EPERM),
            (FsError::ReadOnly, libc::EROFS),
            (FsError::TooManyLinks, libc::EMLINK),
            (FsError::NoData, libc::ENODATA),
            (FsError::Range, libc::ERANGE),
            (FsError::ShutDown, libc::EIO),
            (FsError::Unsupported, libc::EOPNOTSUPP),
            (FsError::NoSuchOffset, libc::ENXIO),
        ];
        for (error, code) in cases {
            assert_eq!(error.to_errno().code(), code, "{error}");
        }
        let corrupt = FsError::Corrupt {
            structure: "inode",
            block: 7,
            detail: "bad magic".into(),
        };
        assert_eq!(corrupt.to_errno().code(), libc::EUCLEAN);
        assert!(is_severe(&corrupt));
        assert!(!is_severe(&FsError::NotFound));
    }
}
