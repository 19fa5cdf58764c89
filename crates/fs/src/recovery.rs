//! Checking a device's log without mounting it.

use cairn_blockdev::BlockDevice;
use cairn_journal::Journal;

use crate::FsError;
use crate::fs::{Filesystem, read_superblock};

impl Filesystem {
    /// Whether mounting `device` would replay log checkpoints (it was not unmounted cleanly).
    /// Reads only, so a read-only mount can refuse a dirty log instead of writing to it.
    pub fn needs_recovery(device: &dyn BlockDevice) -> Result<bool, FsError> {
        let superblock = read_superblock(device)?;
        Ok(Journal::needs_recovery(device, &superblock)?)
    }
}
