//! `FileDevice` on a real block device: a loop device over an image under /tmp. Skipped, with
//! the reason printed, when loop devices cannot be set up here (no losetup, not root, none free).

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError, DeviceKind, FileDevice, OpenOptions};

const IMAGE_BYTES: u64 = 64 << 20;

/// An attached loop device, detached on drop whatever the test did.
struct LoopGuard {
    device: PathBuf,
}

impl LoopGuard {
    /// Attaches `image` with `sector_size`-byte logical sectors, or says why it could not.
    fn attach(image: &Path, sector_size: u32) -> Result<LoopGuard, String> {
        let output = Command::new("losetup")
            .args(["-f", "--show", "-b", &sector_size.to_string()])
            .arg(image)
            .output()
            .map_err(|error| format!("cannot run losetup: {error}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("losetup failed: {}", stderr.trim()));
        }
        let device = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if device.is_empty() {
            return Err("losetup printed no device".to_owned());
        }
        Ok(LoopGuard {
            device: PathBuf::from(device),
        })
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let detached = Command::new("losetup").arg("-d").arg(&self.device).status();
        if !detached.is_ok_and(|status| status.success()) {
            eprintln!("warning: could not detach {}", self.device.display());
        }
    }
}

fn image(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("backing");
    File::create(&path).unwrap().set_len(IMAGE_BYTES).unwrap();
    path
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cairn-loop-")
        .tempdir_in("/tmp")
        .unwrap()
}

// Checks size and sector detection through the ioctls, I/O, flush and discard on a loop device.
#[test]
fn loop_device_geometry_and_io() {
    for sector_size in [512u32, 4096] {
        let dir = temp_dir();
        let backing = image(&dir);
        let guard = match LoopGuard::attach(&backing, sector_size) {
            Ok(guard) => guard,
            Err(reason) => {
                println!("skipped: {reason}");
                return;
            }
        };
        let device = FileDevice::open(&guard.device, &OpenOptions::new()).unwrap();
        assert_eq!(device.kind(), DeviceKind::BlockDevice);
        assert_eq!(device.size_bytes(), IMAGE_BYTES);
        assert_eq!(device.logical_sector_size(), sector_size);
        assert!(device.physical_sector_size() >= sector_size);
        let sector = sector_size as usize;
        let data = AlignedBuf::from_slice(&vec![0xA5; sector * 2]);
        device.write_at(u64::from(sector_size) * 3, &data).unwrap();
        device.flush().unwrap();
        let mut back = AlignedBuf::zeroed(sector * 2);
        device
            .read_at(u64::from(sector_size) * 3, &mut back)
            .unwrap();
        assert_eq!(back, data);
        let misaligned = device.read_at(u64::from(sector_size) / 2, &mut back);
        assert!(matches!(misaligned, Err(DeviceError::Misaligned { .. })));
        // Loop devices pass discard on to the backing file (a punched hole reads as zeros);
        // a kernel without it reports "unsupported", which is also a valid answer.
        if device.discard(0, 1 << 20).unwrap() {
            device
                .read_at(u64::from(sector_size) * 3, &mut back)
                .unwrap();
            assert_eq!(back, AlignedBuf::zeroed(sector * 2));
        }
    }
}

// Checks O_EXCL refusal: a held exclusive open gives `Busy` naming the holder's pid, and a
// second `FileDevice` open in this process is refused too.
#[test]
fn loop_device_exclusive_open() {
    let dir = temp_dir();
    let backing = image(&dir);
    let guard = match LoopGuard::attach(&backing, 512) {
        Ok(guard) => guard,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&guard.device)
        .unwrap();
    let error = FileDevice::open(&guard.device, &OpenOptions::new()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, DeviceError::Busy { .. }), "{error:?}");
    let pid = std::process::id();
    assert!(message.contains(&format!("pid {pid} (")), "{message}");
    drop(holder);
    // A larger sector size than the device's own is allowed; one that is not a multiple is not.
    let coarse = FileDevice::open(&guard.device, &OpenOptions::new().sector_size(4096)).unwrap();
    assert_eq!(coarse.logical_sector_size(), 4096);
    assert_eq!(coarse.size_bytes(), IMAGE_BYTES);
    drop(coarse);
    let first = FileDevice::open(&guard.device, &OpenOptions::new()).unwrap();
    let second = FileDevice::open(&guard.device, &OpenOptions::new().read_only(true));
    assert!(matches!(second, Err(DeviceError::Busy { .. })));
    drop(first);
}
