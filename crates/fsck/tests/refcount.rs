//! Shared blocks (reflink): fsck counts every regular file's mappings against the refcount
//! trees. Each damage (a tree lost, a count off by one, a file without the reflink flag) is
//! found by `-n` (exit 4), repaired by `-y` (exit 1: the tree rebuilt from the files' maps,
//! the flag set), and leaves a clean image whose files read as before.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::agf::Agf;
use cairn_format::btree_block::BtreeLayout;
use cairn_format::inode::INODE_FLAG_REFLINK;
use cairn_format::limits::AG_AGF_BLOCK;
use cairn_format::ondisk::{get_u32, put_u32};
use cairn_format::{AgBlock, AgNumber, MetaKind, OnDisk};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use common::{Image, SECTOR, edit_block, edit_inode, populated, text};

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

/// The populated image with `src` (256 KiB), `whole` (a clone of all of it) and `part` (a
/// clone of its middle 128 KiB at another offset), and what each holds.
struct Shared {
    image: Image,
    files: Vec<(u64, Vec<u8>)>,
    whole: u64,
}

fn shared() -> Shared {
    let image = populated();
    let bytes = std::fs::read(&image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device.clone(), MountOptions::default()).unwrap();
    let who = Credentials::root();
    let make = |name: &[u8]| {
        fs.create(fs.root(), name, FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode
    };
    let (src, whole, part) = (make(b"src"), make(b"whole"), make(b"part"));
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(src, 0, &data).unwrap();
    fs.copy_file_range(src, 0, whole, 0, data.len() as u64)
        .unwrap();
    fs.copy_file_range(src, 64 * 1024, part, 8192, 128 * 1024)
        .unwrap();
    let mut part_data = vec![0u8; 8192];
    part_data.extend_from_slice(&data[64 * 1024..192 * 1024]);
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    Shared {
        image,
        files: vec![(src, data.clone()), (whole, data), (part, part_data)],
        whole,
    }
}

/// The AGF block of the AG whose refcount tree is not empty, and that AGF.
fn agf_with_tree(image: &Image) -> (u64, Agf) {
    let g = image.geometry;
    let bytes = std::fs::read(&image.path).unwrap();
    (0..g.ag_count)
        .find_map(|ag| {
            let at = g.fs_block(AgNumber(ag), AgBlock(AG_AGF_BLOCK)).0;
            let offset = (at * u64::from(g.block_size)) as usize;
            let agf = Agf::decode(&bytes[offset..]).unwrap();
            agf.has_refcount_tree().then_some((at, agf))
        })
        .expect("an AG with shared blocks")
}

/// Mounts the repaired image and checks every file reads as before.
fn files_read_back(shared: &Shared) {
    let bytes = std::fs::read(&shared.image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device, MountOptions::default()).unwrap();
    for (inode, data) in &shared.files {
        let read = fs.read(*inode, 0, data.len() as u32 + 10).unwrap();
        assert_eq!(&read, data, "inode {inode}");
    }
    fs.unmount().unwrap();
}

/// `-n` finds `want`, `-y` repairs, `-n` is clean again, the files read back.
fn found_and_repaired(shared: &Shared, want: &str) {
    let path = shared.image.path.to_str().unwrap();
    let checked = fsck(&["-n", path]);
    assert_eq!(checked.status.code(), Some(4), "{}", text(&checked));
    assert!(text(&checked).contains(want), "{want}: {}", text(&checked));
    let repaired = fsck(&["-y", path]);
    assert_eq!(repaired.status.code(), Some(1), "{}", text(&repaired));
    let again = fsck(&["-n", path]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    files_read_back(shared);
}

// Clones check clean: the refcount tree counts exactly what the files map.
#[test]
fn clones_check_clean() {
    let shared = shared();
    let checked = fsck(&["-n", shared.image.path.to_str().unwrap()]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
}

// The AGF loses its refcount tree: every shared run is found counted 1, and repair builds
// the tree again from the files' maps.
#[test]
fn a_lost_refcount_tree_is_rebuilt() {
    let shared = shared();
    let (at, _) = agf_with_tree(&shared.image);
    edit_block(&shared.image, at, |raw| raw[96..108].fill(0));
    found_and_repaired(&shared, "the refcount tree counts 1, files map them");
    agf_with_tree(&shared.image);
}

// A record counts one more mapping than the files hold.
#[test]
fn a_wrong_count_is_rebuilt() {
    let shared = shared();
    let (_, agf) = agf_with_tree(&shared.image);
    let g = shared.image.geometry;
    let layout = BtreeLayout::for_kind(MetaKind::RefcountBtree, g.block_size).unwrap();
    let ag = agf.ag_number;
    let root = g.fs_block(ag, agf.refcount_root).0;
    edit_block(&shared.image, root, |raw| {
        let record = layout.record_mut(raw, 0).unwrap();
        let count = get_u32(record, 8);
        put_u32(record, 8, count + 1);
    });
    found_and_repaired(&shared, "files map them 2 times");
}

// Two files mapping the same blocks unknown to the refcount tree and without the flag (the
// damage that makes a file without reflink copy the blocks): they share them, counted in a
// rebuilt tree, and both read what they read before.
#[test]
fn blocks_mapped_twice_become_shared() {
    let shared = shared();
    let g = shared.image.geometry;
    let bytes = std::fs::read(&shared.image.path).unwrap();
    let (src, data) = shared.files[0].clone();
    let (block, offset) = g.inode_position(cairn_format::InodeNumber(src)).unwrap();
    let at = (g.byte_offset(block) + offset as u64) as usize;
    let src_core = cairn_format::inode::InodeCore::decode(&bytes[at..]).unwrap();
    let range = src_core.data_fork_range(g.inode_size);
    let fork = bytes[at + range.start..at + range.end].to_vec();
    let extents = cairn_format::inode::fork_extents(&fork, src_core.data_extent_count).unwrap();
    let mut shared = shared;
    let victim = shared.files[2].0;
    edit_inode(&shared.image, victim, |core, literal| {
        core.flags &= !INODE_FLAG_REFLINK;
        core.data_extent_count = extents.len() as u32;
        core.block_count = extents.iter().map(|e| u64::from(e.length)).sum();
        core.size = data.len() as u64;
        let len = range.len();
        cairn_format::inode::put_fork_extents(&extents, &mut literal[..len]).unwrap();
    });
    shared.files[2].1 = data;
    found_and_repaired(&shared, "without the reflink flag");
}

// A file that shares blocks without the reflink flag would free them when it goes: found,
// and the flag set.
#[test]
fn a_missing_reflink_flag_is_set() {
    let shared = shared();
    edit_inode(&shared.image, shared.whole, |core, _| {
        core.flags &= !INODE_FLAG_REFLINK;
    });
    found_and_repaired(&shared, "maps shared blocks without the reflink flag");
}

// cairn-db marks shared extents in `bmap` and lists the refcount records.
#[test]
fn cairn_db_shows_shared_extents() {
    let shared = shared();
    let path = shared.image.path.to_str().unwrap();
    let db = |args: &[&str]| {
        let mut all = vec![path];
        all.extend_from_slice(args);
        common::run(env!("CARGO_BIN_EXE_cairn-db"), &all)
    };
    let bmap = text(&db(&["bmap", "/whole"]));
    assert!(bmap.contains(" shared: ") && bmap.contains(" x3"), "{bmap}");
    let records = db(&["refcount"]);
    assert_eq!(records.status.code(), Some(0), "{}", text(&records));
    let said = text(&records);
    assert!(
        said.contains("shared by 3") && said.contains("shared by 2"),
        "{said}"
    );
    assert!(
        said.contains("shared blocks 64,") || said.contains("shared blocks 64 "),
        "{said}"
    );
    let (_, agf) = agf_with_tree(&shared.image);
    let one = text(&db(&["refcount", &agf.ag_number.0.to_string()]));
    assert!(one.contains("shared by 3"), "{one}");
    assert_eq!(db(&["refcount", "999"]).status.code(), Some(8));
}

// A superblock naming an incompatible feature this build does not know: fsck neither checks
// nor repairs (exit 8, the bits named, the image unchanged), and mount refuses it.
#[test]
fn unknown_features_are_refused() {
    let image = populated();
    edit_block(&image, 0, |raw| {
        let features = cairn_format::ondisk::get_u64(raw, 112);
        cairn_format::ondisk::put_u64(raw, 112, features | 1 << 5);
    });
    let before = std::fs::read(&image.path).unwrap();
    for mode in ["-n", "-y"] {
        let out = fsck(&[mode, image.path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(8), "{mode}: {}", text(&out));
        assert!(text(&out).contains("bits 0x20"), "{}", text(&out));
    }
    assert!(
        std::fs::read(&image.path).unwrap() == before,
        "the image changed"
    );
    let device = Arc::new(MemDevice::from_image(before, SECTOR).unwrap());
    let mounted = Filesystem::mount(device, MountOptions::default());
    assert!(matches!(
        mounted,
        Err(cairn_fs::FsError::UnsupportedFeatures { incompat: 0x20 })
    ));
}
