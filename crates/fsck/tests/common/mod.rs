//! Shared helpers of the fsck tests: populated images built through cairn-fs, the fsck and
//! cairn-db binaries, and editors that damage one structure and re-stamp its CRC.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_format::header::stamp;
use cairn_format::inode::{INODE_CORE_SIZE, InodeCore};
use cairn_format::{Geometry, InodeNumber, OnDisk, Superblock};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use cairn_mkfs::{FormatOptions, Request};

pub const SECTOR: u32 = 4096;
pub const IMAGE_BYTES: u64 = 64 << 20;

/// A populated image file and the inodes the tests damage.
pub struct Image {
    pub _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub geometry: Geometry,
    pub root: u64,
    /// root/a, root/a/b, root/f1 (10 KiB), root/a/f2 with a second link root/f2link,
    /// root/big (300 files: block form with a hash index).
    pub a: u64,
    pub b: u64,
    pub f1: u64,
    pub f2: u64,
    pub big: u64,
}

fn format_device(ag_count: Option<u32>, reflink: bool) -> Arc<MemDevice> {
    let device = MemDevice::new(IMAGE_BYTES, SECTOR);
    let request = Request {
        fs_bytes: Some(IMAGE_BYTES),
        ag_count,
        reflink,
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(IMAGE_BYTES, SECTOR, &request).unwrap();
    let options = FormatOptions {
        uuid: Some([5; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options).unwrap();
    Arc::new(device)
}

/// Builds the populated image, unmounts it cleanly and writes it to a file.
pub fn populated() -> Image {
    populated_in(None)
}

/// The populated image in `ag_count` AGs (the default for its size when `None`).
pub fn populated_in(ag_count: Option<u32>) -> Image {
    populated_with(ag_count, true)
}

/// The populated image made without the reflink feature (files never share blocks).
pub fn populated_without_reflink() -> Image {
    populated_with(None, false)
}

fn populated_with(ag_count: Option<u32>, reflink: bool) -> Image {
    let device = format_device(ag_count, reflink);
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
    let who = Credentials::root();
    let root = fs.root();
    let a = fs.mkdir(root, b"a", 0o755, &who).unwrap().inode;
    let b = fs.mkdir(a, b"b", 0o755, &who).unwrap().inode;
    let f1 = fs
        .create(root, b"f1", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    fs.write(f1, 0, &[7u8; 10240]).unwrap();
    let f2 = fs
        .create(a, b"f2", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    fs.link(f2, root, b"f2link", &who).unwrap();
    let big = fs.mkdir(root, b"big", 0o755, &who).unwrap().inode;
    for index in 0..300 {
        let name = format!("entry-{index:04}");
        fs.create(big, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
            .unwrap();
    }
    fs.unmount().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("image");
    std::fs::write(&path, device.snapshot()).unwrap();
    let geometry = superblock(&path).geometry;
    Image {
        _dir: dir,
        path,
        geometry,
        root,
        a,
        b,
        f1,
        f2,
        big,
    }
}

pub fn superblock(path: &Path) -> Superblock {
    let bytes = std::fs::read(path).unwrap();
    Superblock::read_primary(&bytes[..65536]).unwrap()
}

/// Mounts the image file and unmounts it again: the result must be usable.
pub fn mounts(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device, MountOptions::default()).unwrap();
    let who = Credentials::root();
    let root = fs.root();
    fs.readdir(root, 0, 1000).unwrap();
    fs.create(root, b"after-repair", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.unmount().unwrap();
}

pub fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary).args(args).output().unwrap()
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn read_bytes(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    bytes[offset as usize..offset as usize + len].to_vec()
}

pub fn write_bytes(path: &Path, offset: u64, data: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// Changes inode `number` with `edit` (core and literal area) and re-stamps its CRC.
pub fn edit_inode(image: &Image, number: u64, edit: impl FnOnce(&mut InodeCore, &mut [u8])) {
    let g = image.geometry;
    let (block, offset) = g.inode_position(InodeNumber(number)).unwrap();
    let at = g.byte_offset(block) + offset as u64;
    let mut raw = read_bytes(&image.path, at, g.inode_size as usize);
    let mut core = InodeCore::decode(&raw).unwrap();
    edit(&mut core, &mut raw[INODE_CORE_SIZE..]);
    core.encode(&mut raw[..INODE_CORE_SIZE]);
    stamp(&mut raw, None);
    write_bytes(&image.path, at, &raw);
}

/// Changes the metadata block at `block` with `edit` and re-stamps its CRC.
pub fn edit_block(image: &Image, block: u64, edit: impl FnOnce(&mut [u8])) {
    let size = image.geometry.block_size as usize;
    let at = block * size as u64;
    let mut raw = read_bytes(&image.path, at, size);
    edit(&mut raw);
    stamp(&mut raw, None);
    write_bytes(&image.path, at, &raw);
}

/// Every block of the image whose first four bytes are `magic`.
pub fn blocks_with_magic(image: &Image, magic: &[u8; 4]) -> Vec<u64> {
    let bytes = std::fs::read(&image.path).unwrap();
    let size = image.geometry.block_size as usize;
    bytes
        .chunks_exact(size)
        .enumerate()
        .filter(|(_, block)| &block[..4] == magic)
        .map(|(index, _)| index as u64)
        .collect()
}
