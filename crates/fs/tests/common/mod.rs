//! Shared helpers for the fs tests: a formatted memory device, mounting, and fsck.

#![allow(dead_code)]

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_fs::{Credentials, Filesystem, MountOptions};
use cairn_mkfs::{FormatOptions, Request};

pub const SECTOR: u32 = 4096;

/// A freshly formatted memory device of `fs_bytes`.
pub fn make_device(fs_bytes: u64) -> Arc<MemDevice> {
    let request = Request {
        fs_bytes: Some(fs_bytes),
        ..Request::default()
    };
    format_device(fs_bytes, SECTOR, &request)
}

/// A small filesystem of `block_size` blocks (1 KiB: small tree blocks, so trees split
/// after few records) in `ag_count` AGs.
pub fn make_small_block_device(fs_bytes: u64, block_size: u32, ag_count: u32) -> Arc<MemDevice> {
    let request = Request {
        fs_bytes: Some(fs_bytes),
        block_size,
        ag_count: Some(ag_count),
        ..Request::default()
    };
    format_device(fs_bytes, block_size, &request)
}

fn format_device(fs_bytes: u64, sector: u32, request: &Request) -> Arc<MemDevice> {
    let device = MemDevice::new(fs_bytes, sector);
    let plan = cairn_mkfs::plan(fs_bytes, sector, request).unwrap();
    let options = FormatOptions {
        uuid: Some([5; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options).unwrap();
    Arc::new(device)
}

/// Mounts `device` with default options.
pub fn mount(device: &Arc<MemDevice>) -> Filesystem {
    mount_with(device, MountOptions::default())
}

/// Mounts `device` with `options`.
pub fn mount_with(device: &Arc<MemDevice>, options: MountOptions) -> Filesystem {
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    Filesystem::mount(dyn_device, options).unwrap()
}

/// Mount options with write-behind on, its cap `cap_bytes`.
pub fn write_behind(cap_bytes: u64) -> MountOptions {
    MountOptions {
        data_cache: cap_bytes,
        ..MountOptions::default()
    }
}

/// Runs fsck on `device` and fails the test on any problem.
pub fn fsck_clean(device: &Arc<MemDevice>) {
    let superblock = read_superblock(device);
    let report = cairn_fsck::check::Checker::new(device.as_ref(), superblock).run();
    assert!(report.problems.is_empty(), "fsck: {:#?}", report.problems);
}

fn read_superblock(device: &Arc<MemDevice>) -> cairn_format::Superblock {
    let mut head = cairn_blockdev::AlignedBuf::zeroed(65536);
    device.read_at(0, &mut head).unwrap();
    cairn_format::Superblock::read_primary(&head).unwrap()
}

pub fn root() -> Credentials {
    Credentials::root()
}

pub fn user(uid: u32) -> Credentials {
    Credentials {
        uid,
        gid: uid,
        groups: Vec::new(),
        umask: 0,
    }
}
pub mod model;
