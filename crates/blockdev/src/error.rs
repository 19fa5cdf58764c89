use std::io;
use std::path::PathBuf;

/// Errors from a block device. Each names the operation, the byte range and the device where
/// that is known, so a failing disk is reported precisely.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("{op} of {len} bytes at offset {offset} failed: {source}")]
    Io {
        op: &'static str,
        offset: u64,
        len: u64,
        source: io::Error,
    },

    #[error("{op} at offset {offset} transferred {done} of {len} bytes and then no more")]
    ShortTransfer {
        op: &'static str,
        offset: u64,
        len: u64,
        done: u64,
    },

    #[error(
        "transfer at offset {offset} of {len} bytes is not aligned to the {sector}-byte sector"
    )]
    Misaligned { offset: u64, len: u64, sector: u32 },

    #[error("transfer at offset {offset} of {len} bytes runs past the device end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },

    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },

    #[error(
        "{path} refuses O_DIRECT (tmpfs and some overlay filesystems do); \
         put the image on another filesystem, or use the buffered I/O option \
         (`buffered`, which syncs with fdatasync) at some cost in speed"
    )]
    DirectIoUnsupported { path: PathBuf },

    #[error("{path} is in use: {holder}")]
    Busy { path: PathBuf, holder: String },

    #[error("{path} is not a regular file or block device")]
    NotADevice { path: PathBuf },

    #[error("the device was opened read-only; {op} refused")]
    ReadOnly { op: &'static str },

    #[error("the device has stopped accepting writes (injected fault)")]
    Stopped,

    #[error("injected {op} error at offset {offset}")]
    Injected { op: &'static str, offset: u64 },

    #[error("invalid device geometry: {reason}")]
    Geometry { reason: String },

    #[error("invalid crash point: {reason}")]
    CrashPoint { reason: String },
}
