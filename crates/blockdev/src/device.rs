use crate::{AlignedBuf, BatchWrite, DeviceError, ReadDone, ReadJob};

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

    /// Fill `buf`, any memory, from the device starting at byte `offset`: part of a larger
    /// buffer, so one transfer buffer can hold several device reads. The default reads
    /// through an aligned bounce buffer (`bounce_read`); devices that can transfer into
    /// suitably aligned memory directly override it.
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        bounce_read(self, offset, buf)
    }

    /// Write all of `buf`, any memory, to the device starting at byte `offset`. The default
    /// copies it into an aligned buffer; devices that can transfer from suitably aligned
    /// memory directly override it.
    fn write_from(&self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.write_at(offset, &AlignedBuf::from_slice(buf))
    }

    /// Writes every `(offset, bytes)` of `writes`, which no flush separates, so the device
    /// may run them at once and in any order. Every write is attempted and none is in
    /// flight on return; the first failure is returned. The default writes one at a time.
    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Result<(), DeviceError> {
        writes
            .iter()
            .map(|&(offset, buf)| self.write_from(offset, buf))
            .fold(Ok(()), Result::and)
    }

    /// Reads every part of `job` into its buffer and calls `done` with the buffer and the
    /// first failure, if any. A device that can keep reads in flight returns at once and
    /// calls `done` later on a thread of its own (`FileDevice`: io_uring); the default reads
    /// the parts one by one and calls `done` before returning. `done` must not wait for
    /// anything a read in flight could hold up.
    fn read_async(&self, job: ReadJob, done: ReadDone) {
        let ReadJob { mut buf, parts } = job;
        let outcome = parts
            .iter()
            .try_for_each(|(offset, range)| self.read_into(*offset, &mut buf[range.clone()]));
        done(buf, outcome);
    }

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

    /// Takes in a larger device: an image file shorter than `bytes` is extended (sparse),
    /// a block device's size is read again. Returns the size now. Devices that cannot
    /// change size keep theirs.
    fn grow_to(&self, bytes: Option<u64>) -> Result<u64, DeviceError> {
        let _ = bytes;
        Ok(self.size_bytes())
    }

    /// Make a byte range read back as zeros. The default writes zeroed buffers; devices with
    /// a cheaper way (hole punching, `BLKZEROOUT`) override it.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        write_zero_buffers(self, offset, len)
    }
}

/// `read_into` through an aligned buffer of `buf`'s length, then a copy.
pub fn bounce_read<D: BlockDevice + ?Sized>(
    device: &D,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), DeviceError> {
    let mut bounce = AlignedBuf::zeroed(buf.len());
    device.read_at(offset, &mut bounce)?;
    buf.copy_from_slice(&bounce);
    Ok(())
}

/// Largest single write `write_zero_buffers` issues.
const ZEROES_CHUNK_BYTES: u64 = 1 << 20;

/// Zeroes a byte range by writing zeroed buffers: the default `write_zeroes`, and the
/// fallback of devices whose cheaper method is unsupported.
pub fn write_zero_buffers<D: BlockDevice + ?Sized>(
    device: &D,
    offset: u64,
    len: u64,
) -> Result<(), DeviceError> {
    check_transfer(
        offset,
        len,
        device.logical_sector_size(),
        device.size_bytes(),
    )?;
    let chunk_max = ZEROES_CHUNK_BYTES.max(u64::from(device.logical_sector_size()));
    let zeroes = AlignedBuf::zeroed(chunk_max.min(len) as usize);
    let mut done = 0;
    while done < len {
        let chunk = chunk_max.min(len - done);
        if chunk == zeroes.len() as u64 {
            device.write_at(offset + done, &zeroes)?;
        } else {
            device.write_at(offset + done, &AlignedBuf::zeroed(chunk as usize))?;
        }
        done += chunk;
    }
    Ok(())
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
    use crate::MemDevice;

    // Checks that the default write_zeroes clears exactly the range, across chunk boundaries.
    #[test]
    fn default_write_zeroes_clears_the_range() {
        let dev = MemDevice::new(4 << 20, 512);
        dev.write_at(0, &AlignedBuf::from_slice(&vec![0xab; 4 << 20]))
            .unwrap();
        let (offset, len) = (512, (1 << 20) + 1024);
        dev.write_zeroes(offset, len).unwrap();
        let mut back = AlignedBuf::zeroed(4 << 20);
        dev.read_at(0, &mut back).unwrap();
        let end = (offset + len) as usize;
        assert!(back[..512].iter().all(|&b| b == 0xab));
        assert!(back[512..end].iter().all(|&b| b == 0));
        assert!(back[end..].iter().all(|&b| b == 0xab));
        assert!(dev.write_zeroes(100, 512).is_err());
    }

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
