#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Minimal reproductions of violations the explorer found in other crates. Open ones run only
//! with `CAIRN_CRASH_OPEN=1` (they fail until fixed) and are listed in docs/reliability.md.

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_crashtest::image::{self, SECTOR_BYTES};
use cairn_fs::Credentials;

fn open_enabled() -> bool {
    std::env::var_os("CAIRN_CRASH_OPEN").is_some()
}

// Creates two directories, syncs, crashes (durable image) and checks recovery finds both
// inodes allocated and fsck clean. Open: the second directory's inode (a new chunk in another
// AG) reads back free.
#[test]
fn regression_sync_then_crash_keeps_new_directories() {
    if !open_enabled() {
        return;
    }
    let device = Arc::new(image::formatted_device(image::CRASH_DEVICE_BYTES).unwrap());
    let fs = image::mount(&device).unwrap();
    let who = Credentials::root();
    fs.mkdir(fs.root(), b"A", 0o755, &who).unwrap();
    fs.mkdir(fs.root(), b"B", 0o755, &who).unwrap();
    fs.sync().unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), SECTOR_BYTES).unwrap());
    drop(fs);
    let fs = image::mount(&crashed).unwrap();
    for name in [&b"A"[..], b"B"] {
        let attr = fs.lookup(fs.root(), name).unwrap();
        fs.getattr(attr.inode).unwrap();
    }
    fs.unmount().unwrap();
    image::fsck(crashed.as_ref()).unwrap();
}

// Formats a 16 MiB filesystem with mkfs's default log size and checks that it mounts and
// takes a mkdir (mkfs once chose a 512 KiB log, smaller than the journal accepts).
#[test]
fn regression_mkfs_default_log_mountable() {
    let bytes = 16 << 20;
    let request = cairn_mkfs::Request {
        fs_bytes: Some(bytes),
        ..cairn_mkfs::Request::default()
    };
    let device = Arc::new(image::format_with(bytes, &request).unwrap());
    let fs = image::mount(&device).unwrap();
    fs.mkdir(fs.root(), b"A", 0o755, &Credentials::root())
        .unwrap();
    fs.unmount().unwrap();
}
