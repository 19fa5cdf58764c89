//! Thin wrappers over the Linux calls std does not offer: block-device ioctls and hole punching.
//! Each returns the raw `io::Error`; the caller adds the operation and range.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Block-device ioctl numbers missing from the libc crate. The encodings are the generic ones
/// (x86, arm, riscv); other architectures put the direction bits elsewhere.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64"
))]
mod ioctl {
    /// `_IOR(0x12, 114, u64)`: device size in bytes.
    pub const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
    /// `_IO(0x12, 119)`: discard a byte range given as `[offset, len]`.
    pub const BLKDISCARD: libc::Ioctl = 0x1277;
    /// `_IO(0x12, 127)`: zero a range of a block device (offloaded where the device can).
    pub const BLKZEROOUT: libc::Ioctl = 0x127f;
}
use ioctl::{BLKDISCARD, BLKGETSIZE64, BLKZEROOUT};

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Size of the block device behind `file`, in bytes.
pub(crate) fn block_size_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid for the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) })?;
    Ok(size)
}

/// Logical sector size of the block device behind `file`.
pub(crate) fn logical_sector_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid for the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut size) })?;
    u32::try_from(size).map_err(|_| io::Error::other(format!("BLKSSZGET gave {size}")))
}

/// Physical sector size of the block device behind `file`.
pub(crate) fn physical_sector_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, valid for the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKPBSZGET, &mut size) })?;
    Ok(size)
}

/// Discards `len` bytes at `offset` on the block device behind `file`.
pub(crate) fn block_discard(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads two u64 through the pointer, which is valid for the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD, &range) })
}

/// Zeroes `len` bytes at `offset` of a block device with `BLKZEROOUT`.
pub(crate) fn block_zero_out(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKZEROOUT reads two u64 through the pointer, which is valid for the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT, &range) })
}

/// Deallocates `len` bytes at `offset` of a regular file, keeping its size; reads return zeros.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let too_big = || io::Error::from_raw_os_error(libc::EFBIG);
    let offset = libc::off_t::try_from(offset).map_err(|_| too_big())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_big())?;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    loop {
        // SAFETY: plain system call on an open descriptor; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
        match check(rc) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Whether `error` means the operation is not supported here (so discard reports `false`).
pub(crate) fn is_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS)
    )
}
