//! A read-only view of an image file or block device for `cairn-db`, which must be safe on a
//! mounted filesystem: no lock, no exclusive claim, buffered reads (so it sees what the
//! running daemon has written, and never competes for the writer's lock). Every write is
//! refused. `FileDevice` deliberately refuses to open a device a writer holds, so this view
//! lives here rather than as an option that would weaken that guarantee for every user.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};

/// Sector size the view reports: the smallest any cairn filesystem uses.
const SNOOP_SECTOR_BYTES: u32 = 512;

/// An image file or block device opened read-only, without any lock.
#[derive(Debug)]
pub struct SnoopDevice {
    file: File,
    size_bytes: u64,
}

impl SnoopDevice {
    pub fn open(path: &Path) -> Result<Self, DeviceError> {
        let open_error = |source| DeviceError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_error)?;
        // `seek` to the end gives block devices' sizes as well as files'.
        let size_bytes =
            std::io::Seek::seek(&mut &file, std::io::SeekFrom::End(0)).map_err(open_error)?;
        Ok(Self { file, size_bytes })
    }
}

impl BlockDevice for SnoopDevice {
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        if offset.saturating_add(len) > self.size_bytes {
            return Err(DeviceError::OutOfRange {
                offset,
                len,
                size: self.size_bytes,
            });
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| DeviceError::Io {
                op: "read",
                offset,
                len,
                source,
            })
    }

    fn write_at(&self, _offset: u64, _buf: &AlignedBuf) -> Result<(), DeviceError> {
        Err(DeviceError::ReadOnly { op: "write" })
    }

    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn discard(&self, _offset: u64, _len: u64) -> Result<bool, DeviceError> {
        Err(DeviceError::ReadOnly { op: "discard" })
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_sector_size(&self) -> u32 {
        SNOOP_SECTOR_BYTES
    }

    fn physical_sector_size(&self) -> u32 {
        SNOOP_SECTOR_BYTES
    }

    fn read_only(&self) -> bool {
        true
    }
}
