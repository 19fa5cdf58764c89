//! Formatted memory devices, mounting, and running the fsck checker on a device.

use std::sync::Arc;

use cairn_blockdev::{AlignedBuf, BlockDevice, MemDevice};
use cairn_format::Superblock;
use cairn_format::limits::BLOCK_SIZE_MAX;
use cairn_fs::{Filesystem, FsError, LogMode, MountOptions};

use crate::CrashError;

/// Sector size of every test device: 512 bytes, so crash images can tear a 4 KiB block.
pub const SECTOR_BYTES: u32 = 512;
/// Size of the devices the crash explorer uses: small, so each crash image is cheap to build.
pub const CRASH_DEVICE_BYTES: u64 = 16 << 20;
/// The UUID every test image carries, so failures reproduce byte for byte.
pub const TEST_UUID: [u8; 16] = [0xc4; 16];

/// A freshly formatted memory device of `fs_bytes` (recording on, log empty).
pub fn formatted_device(fs_bytes: u64) -> Result<MemDevice, CrashError> {
    let request = cairn_mkfs::Request {
        fs_bytes: Some(fs_bytes),
        ..cairn_mkfs::Request::default()
    };
    format_with(fs_bytes, &request)
}

/// A memory device of `fs_bytes` formatted as `request` asks.
pub fn format_with(fs_bytes: u64, request: &cairn_mkfs::Request) -> Result<MemDevice, CrashError> {
    let device = MemDevice::try_new(fs_bytes, SECTOR_BYTES)?;
    let plan = cairn_mkfs::plan(fs_bytes, SECTOR_BYTES, request)
        .map_err(|error| CrashError::Setup(error.to_string()))?;
    let options = cairn_mkfs::FormatOptions {
        uuid: Some(TEST_UUID),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options)
        .map_err(|error| CrashError::Setup(error.to_string()))?;
    device.clear_log();
    Ok(device)
}

/// The mount options a workload runs with (recovery mounts use the defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkloadMount {
    /// Online discard: freed blocks are zeroed on the memory device once their free is
    /// durable.
    pub discard: bool,
    /// Write-behind cap in bytes (0: off, every write goes to the device at once).
    pub data_cache: u64,
    /// `logmode=sync`: every transaction is durable when it commits, so crash points fall
    /// between any two transactions (between a writeback's allocation and its conversion).
    pub log_sync: bool,
}

/// Mounts `device` with default options (recovery runs here).
pub fn mount(device: &Arc<MemDevice>) -> Result<Filesystem, FsError> {
    mount_with(device, WorkloadMount::default())
}

/// Mounts `device` with default options changed as `choice` asks.
pub fn mount_with(device: &Arc<MemDevice>, choice: WorkloadMount) -> Result<Filesystem, FsError> {
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    let options = MountOptions {
        discard: choice.discard,
        data_cache: choice.data_cache,
        log_mode: match choice.log_sync {
            true => LogMode::Sync,
            false => LogMode::Delayed,
        },
        ..MountOptions::default()
    };
    Filesystem::mount(dyn_device, options)
}

/// Reads the primary superblock of `device`.
pub fn read_superblock(device: &dyn BlockDevice) -> Result<Superblock, CrashError> {
    let sector = u64::from(device.logical_sector_size());
    let len = u64::from(BLOCK_SIZE_MAX).min(device.size_bytes()) / sector * sector;
    let mut head = AlignedBuf::zeroed(len as usize);
    device.read_at(0, &mut head)?;
    Superblock::read_primary(&head).map_err(|error| CrashError::Fsck(vec![error.to_string()]))
}

/// Runs the fsck checker on `device`: `Ok` when it is clean, else every problem it found.
pub fn fsck(device: &dyn BlockDevice) -> Result<(), CrashError> {
    let superblock = read_superblock(device)?;
    let report = cairn_fsck::check::Checker::new(device, superblock).run();
    if report.problems.is_empty() {
        return Ok(());
    }
    let problems = report.problems.iter().map(ToString::to_string).collect();
    Err(CrashError::Fsck(problems))
}
