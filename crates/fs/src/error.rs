//! The crate's one error type. Each variant maps to one errno in the FUSE crate; no errno
//! values appear here.

use cairn_alloc::AllocError;
use cairn_blockdev::DeviceError;
use cairn_btree::TreeError;
use cairn_bufcache::BufCacheError;
use cairn_format::FormatError;
use cairn_journal::JournalError;

/// Errors of filesystem operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDirectory,
    #[error("is a directory")]
    IsDirectory,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("invalid name")]
    InvalidName,
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    #[error("no space left on the filesystem")]
    NoSpace,
    #[error("permission denied")]
    PermissionDenied,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("read-only filesystem")]
    ReadOnly,
    #[error("cross-device link")]
    CrossDevice,
    #[error("too many links")]
    TooManyLinks,
    #[error("no such attribute")]
    NoData,
    #[error("value out of range")]
    Range,
    /// A file would grow past the largest size (an insert range).
    #[error("file too large")]
    FileTooBig,
    #[error("I/O error while {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("corrupt {structure} at block {block}: {detail}")]
    Corrupt {
        structure: &'static str,
        block: u64,
        detail: String,
    },
    #[error("the filesystem has shut down after an error")]
    ShutDown,
    #[error("operation not supported")]
    Unsupported,
    /// The superblock names incompatible features this build does not know.
    #[error(
        "the filesystem uses features this cairn does not know (incompatible feature bits \
         {incompat:#x}); mount it with a newer cairn"
    )]
    UnsupportedFeatures { incompat: u64 },
    /// `seek` for data at or past the last data, or from an offset at or past the end.
    #[error("no data or hole at or after the offset")]
    NoSuchOffset,
}

impl FsError {
    /// A corruption report for `structure` at `block`.
    pub(crate) fn corrupt(structure: &'static str, block: u64, detail: impl Into<String>) -> Self {
        Self::Corrupt {
            structure,
            block,
            detail: detail.into(),
        }
    }

    fn io(what: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Io {
            what,
            source: Box::new(source),
        }
    }
}

impl From<FormatError> for FsError {
    fn from(error: FormatError) -> Self {
        Self::corrupt("metadata", 0, error.to_string())
    }
}

impl From<DeviceError> for FsError {
    fn from(error: DeviceError) -> Self {
        Self::io("accessing the device", error)
    }
}

impl From<BufCacheError> for FsError {
    fn from(error: BufCacheError) -> Self {
        match error {
            BufCacheError::Verify { .. } => Self::corrupt("metadata block", 0, error.to_string()),
            other => Self::io("reading metadata", other),
        }
    }
}

impl From<JournalError> for FsError {
    fn from(error: JournalError) -> Self {
        match error {
            JournalError::Shutdown { .. } => Self::ShutDown,
            JournalError::Buffer(inner) => inner.into(),
            other => Self::io("logging", other),
        }
    }
}

impl From<TreeError> for FsError {
    fn from(error: TreeError) -> Self {
        match error {
            TreeError::NoSpace { .. } => Self::NoSpace,
            TreeError::Buffer { source, .. } => source.into(),
            other => Self::corrupt("b+tree", 0, other.to_string()),
        }
    }
}

impl From<AllocError> for FsError {
    fn from(error: AllocError) -> Self {
        match error {
            AllocError::Tree(inner) => inner.into(),
            AllocError::Corrupt { block, what } => Self::corrupt("free space", block, what),
            other => Self::io("allocating space", other),
        }
    }
}
