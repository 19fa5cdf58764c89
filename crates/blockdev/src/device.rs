use crate::{AlignedBuf, DeviceError};

/// A block device: a fixed-size array of bytes addressed by offset, transferred in whole
/// sectors.
///
/// Ordering contract (the same as a disk with a volatile write cache): a write is durable once a
/// `flush` that started after the write returned has itself returned. Writes not separated by a
/// flush may reach stable storage in any order, or partly (torn at sector granularity).
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Fill `buf` from the device starting at byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError>;

    /// Write all of `buf` to the device starting at byte `offset`.
    fn write_at(&self, offset: u64, buf: &AlignedBuf) -> Result<(), DeviceError>;

    /// Durability barrier: every write that completed before this call is stable after it.
    fn flush(&self) -> Result<(), DeviceError>;

    /// Tell the device that a byte range no longer holds data. Returns `Ok(false)` when the
    /// device does not support discard (the range then keeps its old contents).
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError>;

    /// Size of the device in bytes.
    fn size_bytes(&self) -> u64;

    /// Smallest unit of transfer; every offset and length must be a multiple of it.
    fn logical_sector_size(&self) -> u32;

    /// Unit the device writes atomically; writes smaller than this may be read-modify-write.
    fn physical_sector_size(&self) -> u32;

    /// Whether writes are refused.
    fn read_only(&self) -> bool;
}

/// Checks a transfer of `len` bytes at `offset` against a device's sector size and size. Every
/// `BlockDevice` implementation calls this before touching the medium.
pub fn check_transfer(offset: u64, len: u64, sector: u32, size: u64) -> Result<(), DeviceError> {
    let sector64 = u64::from(sector);
    if sector64 == 0 || !offset.is_multiple_of(sector64) || !len.is_multiple_of(sector64) {
        return Err(DeviceError::Misaligned {
            offset,
            len,
            sector,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange { offset, len, size }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the alignment and range rules every device applies.
    #[test]
    fn transfer_checks() {
        assert!(check_transfer(0, 512, 512, 4096).is_ok());
        assert!(check_transfer(3584, 512, 512, 4096).is_ok());
        assert!(matches!(
            check_transfer(1, 512, 512, 4096),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            check_transfer(0, 100, 512, 4096),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            check_transfer(4096, 512, 512, 4096),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            check_transfer(u64::MAX - 511, 512, 512, u64::MAX),
            Err(DeviceError::OutOfRange { .. })
        ));
    }
}
