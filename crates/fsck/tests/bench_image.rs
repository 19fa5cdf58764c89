//! Builds the image the fsck.cairn timing in `docs/benchmarks.md` runs on: a 10 GiB sparse
//! image file holding 100,000 files of varied small sizes in 100 directories, made through
//! cairn-fs on a `FileDevice` (no daemon). Ignored: run it in release with the image path in
//! `CAIRN_FSCK_BENCH_IMAGE`:
//!
//! `CAIRN_FSCK_BENCH_IMAGE=/path/img cargo test --release -p cairn-fsck --test bench_image
//!  -- --ignored`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, FileDevice, OpenOptions};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use cairn_mkfs::{FormatOptions, Request};

const IMAGE_BYTES: u64 = 10 << 30;
const DIRECTORIES: u32 = 100;
const FILES_PER_DIRECTORY: u32 = 1000;

/// A size between 0 and 16 KiB that varies from file to file (some empty, most a few KiB).
fn file_size(index: u32) -> usize {
    (index.wrapping_mul(2_654_435_761) % 16_384) as usize * usize::from(!index.is_multiple_of(10))
}

#[test]
#[ignore = "builds a 10 GiB image; run by hand for docs/benchmarks.md"]
fn build_benchmark_image() {
    let path = std::env::var("CAIRN_FSCK_BENCH_IMAGE").expect("set CAIRN_FSCK_BENCH_IMAGE");
    let _ = std::fs::remove_file(&path);
    let options = OpenOptions {
        direct: false,
        create_size: Some(IMAGE_BYTES),
        ..OpenOptions::default()
    };
    let device = FileDevice::open(&path, &options).unwrap();
    let request = Request {
        fs_bytes: Some(IMAGE_BYTES),
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(IMAGE_BYTES, device.logical_sector_size(), &request).unwrap();
    let format = FormatOptions {
        uuid: None,
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &format).unwrap();
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    let fs = Filesystem::mount(device, MountOptions::default()).unwrap();
    let who = Credentials::root();
    let data = vec![0x5au8; 16_384];
    for dir_index in 0..DIRECTORIES {
        let name = format!("dir-{dir_index:03}");
        let dir = fs.mkdir(fs.root(), name.as_bytes(), 0o755, &who).unwrap();
        for file_index in 0..FILES_PER_DIRECTORY {
            let name = format!("file-{file_index:04}");
            let file = fs
                .create(
                    dir.inode,
                    name.as_bytes(),
                    FileKind::Regular,
                    0o644,
                    0,
                    &who,
                )
                .unwrap();
            let size = file_size(dir_index * FILES_PER_DIRECTORY + file_index);
            if size > 0 {
                fs.write(file.inode, 0, &data[..size]).unwrap();
            }
        }
    }
    fs.unmount().unwrap();
}
