//! Opening a device and finding its cairn superblock.

use std::path::Path;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError, FileDevice, OpenOptions};
use cairn_format::limits::BLOCK_SIZE_MAX;
use cairn_format::{FormatError, Superblock};

use crate::FsckError;

/// An open device with the geometry its primary superblock describes.
#[derive(Debug)]
pub struct Opened {
    pub device: FileDevice,
    /// The primary superblock, or the error that made it unusable.
    pub primary: Result<Superblock, FormatError>,
}

/// Opens `path` read-only and reads the primary superblock. If the filesystem uses sectors
/// smaller than the default image sector, the image is reopened with its own sector size so
/// that single blocks can be read directly.
pub fn open(path: &Path, buffered: bool) -> Result<Opened, FsckError> {
    open_with(path, buffered, true)
}

/// Opens `path` read-write for repair. The device's exclusive lock refuses a device that a
/// mounted filesystem or any other writer holds, naming the holder.
pub fn open_writable(path: &Path, buffered: bool) -> Result<Opened, FsckError> {
    open_with(path, buffered, false)
}

fn open_with(path: &Path, buffered: bool, read_only: bool) -> Result<Opened, FsckError> {
    let options = OpenOptions {
        read_only,
        direct: !buffered,
        ..OpenOptions::default()
    };
    let device = FileDevice::open(path, &options)?;
    let primary = read_primary(&device)?;
    // A filesystem with features this build does not know is neither checked nor repaired:
    // what looks wrong to this fsck may be the feature's own structures.
    if let Err(FormatError::UnsupportedFeatures { features, .. }) = primary {
        return Err(FsckError::UnsupportedFeatures { incompat: features });
    }
    if let Ok(sb) = &primary
        && sb.geometry.block_size < device.logical_sector_size()
    {
        let options = OpenOptions {
            sector_size: Some(sb.geometry.sector_size),
            ..options
        };
        drop(device);
        let device = FileDevice::open(path, &options)?;
        return Ok(Opened { device, primary });
    }
    Ok(Opened { device, primary })
}

/// Reads the first blocks of the device and decodes the primary superblock from them.
pub fn read_primary(
    device: &dyn BlockDevice,
) -> Result<Result<Superblock, FormatError>, DeviceError> {
    let sector = u64::from(device.logical_sector_size());
    let len = u64::from(BLOCK_SIZE_MAX).min(device.size_bytes()) / sector * sector;
    let mut head = AlignedBuf::zeroed(len as usize);
    device.read_at(0, &mut head)?;
    Ok(Superblock::read_primary(&head))
}
