//! Repairs that rebuild what other data determines, and damage that keeps a block verifying:
//! a directory's two-level hash index after entries go or when one of its blocks is wrong,
//! a directory whose data block 0 is lost, a file extent tree whose keys or counts are wrong,
//! counters after repair frees blocks, nonzero reserved fields, flags and extent size hints
//! an inode may not carry, a name held twice and a log whose newest record names no tail.
//! After each, `-y` exits 1, `-n` is clean, a second `-y` changes nothing, and what the
//! damage did not hold is intact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use cairn_blockdev::MemDevice;
use cairn_format::btree_block::BtreeLayout;
use cairn_format::header::MetaHeader;
use cairn_format::log::{LOG_RECORD_HEADER_BYTES, decode_log_record, log_header_crc};
use cairn_format::ondisk::{get_u16, get_u32, put_u16, put_u32, put_u64};
use cairn_format::{InodeNumber, MetaKind, OnDisk};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use common::{Image, SECTOR, blocks_with_magic, edit_block, text};

/// Entries of the wide directory: more than one hash index leaf holds (4 KiB blocks).
const WIDE_ENTRIES: usize = 1200;
/// Separate extents of the fragmented file: more than one extent tree leaf holds.
const FRAG_EXTENTS: u64 = 600;

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

/// The populated image plus `wide` (a directory with a two-level index) and `frag` (a file
/// with a multi-leaf extent tree); its bytes are made once.
struct Wide {
    image: Image,
    wide: u64,
    frag: u64,
}

fn wide() -> Wide {
    static BYTES: OnceLock<(Vec<u8>, u64, u64)> = OnceLock::new();
    let image = common::populated();
    let (bytes, wide, frag) = BYTES.get_or_init(|| {
        let (device, fs) = mount_file(&image.path);
        let who = Credentials::root();
        let wide = fs.mkdir(fs.root(), b"wide", 0o755, &who).unwrap().inode;
        for index in 0..WIDE_ENTRIES {
            let name = format!("name-{index:05}");
            let attr = fs
                .create(wide, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
                .unwrap();
            fs.forget(attr.inode, 1);
        }
        let frag = fs
            .create(fs.root(), b"frag", FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode;
        let block = u64::from(image.geometry.block_size);
        for index in 0..FRAG_EXTENTS {
            fs.write(frag, 2 * index * block, &frag_block(index, block))
                .unwrap();
        }
        fs.unmount().unwrap();
        (device.snapshot(), wide, frag)
    });
    std::fs::write(&image.path, bytes).unwrap();
    Wide {
        image,
        wide: *wide,
        frag: *frag,
    }
}

fn frag_block(index: u64, block: u64) -> Vec<u8> {
    vec![(index % 251) as u8 + 1; block as usize]
}

fn mount_file(path: &Path) -> (Arc<MemDevice>, Filesystem) {
    let device = Arc::new(MemDevice::from_image(std::fs::read(path).unwrap(), SECTOR).unwrap());
    let fs = Filesystem::mount(device.clone(), MountOptions::default()).unwrap();
    (device, fs)
}

/// `-y` repairs (exit 1), `-n` is then clean, and a second `-y` finds nothing to do.
fn repair(image: &Image) -> String {
    let path = image.path.to_str().unwrap();
    let repaired = fsck(&["-y", path]);
    let said = text(&repaired);
    assert_eq!(repaired.status.code(), Some(1), "-y:\n{said}");
    let checked = fsck(&["-n", path]);
    assert_eq!(
        checked.status.code(),
        Some(0),
        "-n after -y:\n{}\n-y said:\n{said}",
        text(&checked)
    );
    let before = std::fs::read(&image.path).unwrap();
    let again = fsck(&["-y", path]);
    assert_eq!(again.status.code(), Some(0), "second -y:\n{}", text(&again));
    assert_eq!(
        std::fs::read(&image.path).unwrap(),
        before,
        "the second -y wrote"
    );
    said
}

/// Every name of the wide directory but `except` is found by lookup (through the index).
fn wide_names_found(wide: &Wide, except: &[usize]) {
    let (_device, fs) = mount_file(&wide.image.path);
    for index in (0..WIDE_ENTRIES).filter(|i| !except.contains(i)) {
        let name = format!("name-{index:05}");
        assert!(
            fs.lookup(wide.wide, name.as_bytes()).is_ok(),
            "{name} not found"
        );
    }
    fs.unmount().unwrap();
}

/// The blocks of `kind` whose header names `owner`, in block order.
fn owned_blocks(image: &Image, kind: MetaKind, owner: u64) -> Vec<u64> {
    let size = u64::from(image.geometry.block_size);
    blocks_with_magic(image, &kind.magic().to_le_bytes())
        .into_iter()
        .filter(|&block| {
            let raw = common::read_bytes(&image.path, block * size, 48);
            MetaHeader::decode(&raw).unwrap().owner == owner
        })
        .collect()
}

/// The inode numbers named by the wide directory's entries, in name order (from a mount).
fn wide_inode(wide: &Wide, index: usize) -> u64 {
    let (_device, fs) = mount_file(&wide.image.path);
    let name = format!("name-{index:05}");
    let inode = fs.lookup(wide.wide, name.as_bytes()).unwrap().inode;
    fs.unmount().unwrap();
    inode
}

// An inode the directory names is damaged: repair clears it and removes its entry, and the
// two-level hash index is rebuilt over the entries left (before, it kept a record pointing
// where no entry is).
#[test]
fn index_is_rebuilt_after_repair_removes_an_entry() {
    let wide = wide();
    let victim = wide_inode(&wide, 700);
    let g = wide.image.geometry;
    let (block, offset) = g.inode_position(InodeNumber(victim)).unwrap();
    let at = g.byte_offset(block) + offset as u64 + 60;
    let mut byte = common::read_bytes(&wide.image.path, at, 1);
    byte[0] ^= 0x10;
    common::write_bytes(&wide.image.path, at, &byte);
    let said = repair(&wide.image);
    assert!(said.contains("hash index rebuilt"), "{said}");
    wide_names_found(&wide, &[700]);
}

// Each way a hash tree block can be wrong while its CRC holds (bad magic, a left sibling
// outside the tree's address space, a record count one short, a record's hash changed) gets
// the index rebuilt from the entries; every name is found again.
#[test]
fn damaged_hash_tree_blocks_are_rebuilt() {
    type Edit = fn(&mut [u8]);
    let edits: [(&str, Edit); 4] = [
        ("magic", |raw| raw[0] ^= 0x01),
        ("left", |raw| put_u64(raw, 56, 1 << 40)),
        ("record_count", |raw| {
            let count = get_u16(raw, 50);
            put_u16(raw, 50, count - 1);
        }),
        ("hash", |raw| {
            let hash = get_u32(raw, 72 + 8 * 3);
            put_u32(raw, 72 + 8 * 3, hash.wrapping_add(1));
        }),
    ];
    for (what, edit) in edits {
        let wide = wide();
        let blocks = owned_blocks(&wide.image, MetaKind::DirBtree, wide.wide);
        assert!(blocks.len() >= 3, "the index has {} blocks", blocks.len());
        let size = u64::from(wide.image.geometry.block_size);
        let leaf = blocks
            .iter()
            .copied()
            .find(|&b| get_u16(&common::read_bytes(&wide.image.path, b * size, 64), 48) == 0)
            .unwrap();
        edit_block(&wide.image, leaf, edit);
        let said = repair(&wide.image);
        assert!(said.contains("hash index rebuilt"), "{what}: {said}");
        wide_names_found(&wide, &[]);
    }
}

// Data block 0 of a block directory (which holds the parent and index markers) is zeroed:
// the markers are written again, the entries of the other blocks kept, the index rebuilt.
#[test]
fn lost_first_directory_block_keeps_the_others() {
    let wide = wide();
    let first = owned_blocks(&wide.image, MetaKind::DirData, wide.wide)[0];
    let size = u64::from(wide.image.geometry.block_size);
    let raw = common::read_bytes(&wide.image.path, first * size, size as usize);
    let held: Vec<usize> = cairn_format::dir::dir_data_entries(&raw)
        .unwrap()
        .iter()
        .filter_map(|e| {
            std::str::from_utf8(&e.name)
                .ok()?
                .strip_prefix("name-")?
                .parse()
                .ok()
        })
        .collect();
    assert!(!held.is_empty() && held.len() < WIDE_ENTRIES / 2);
    common::write_bytes(&wide.image.path, first * size, &vec![0u8; size as usize]);
    let said = repair(&wide.image);
    assert!(said.contains("emptied"), "{said}");
    wide_names_found(&wide, &held);
}

/// The fragmented file's extent tree leaves, in block order.
fn frag_leaves(wide: &Wide) -> Vec<u64> {
    let size = u64::from(wide.image.geometry.block_size);
    owned_blocks(&wide.image, MetaKind::BmapBtree, wide.frag)
        .into_iter()
        .filter(|&b| get_u16(&common::read_bytes(&wide.image.path, b * size, 64), 48) == 0)
        .collect()
}

/// Every block the fragmented file wrote reads back, but those of the extents in `lost`.
fn frag_reads_back(wide: &Wide, lost: &[u64]) {
    let (_device, fs) = mount_file(&wide.image.path);
    let block = u64::from(wide.image.geometry.block_size);
    for index in (0..FRAG_EXTENTS).filter(|i| !lost.contains(i)) {
        let data = fs.read(wide.frag, 2 * index * block, block as u32).unwrap();
        assert_eq!(data, frag_block(index, block), "block {index}");
    }
    fs.unmount().unwrap();
}

// A leaf of a file's extent tree with two records swapped (keys out of order), or with a
// record count one short of what it holds (the inode's extent count disagrees), keeps its
// CRC: repair stores the map anew from the records that verify; the file reads as before
// (but for the record the count left out).
#[test]
fn extent_tree_with_bad_keys_or_counts_is_rebuilt() {
    let layout = |size| BtreeLayout::for_kind(MetaKind::BmapBtree, size).unwrap();
    for swap in [true, false] {
        let wide = wide();
        let leaf = frag_leaves(&wide)[1];
        let size = wide.image.geometry.block_size;
        let mut lost = Vec::new();
        edit_block(&wide.image, leaf, |raw| {
            let layout = layout(size);
            let count = usize::from(get_u16(raw, 50));
            if swap {
                let a = layout.record(raw, 2).unwrap().to_vec();
                let b = layout.record(raw, 3).unwrap().to_vec();
                layout.record_mut(raw, 2).unwrap().copy_from_slice(&b);
                layout.record_mut(raw, 3).unwrap().copy_from_slice(&a);
            } else {
                let last = cairn_format::Extent::decode(layout.record(raw, count - 1).unwrap());
                lost.push(last.unwrap().file_block / 2);
                put_u16(raw, 50, count as u16 - 1);
            }
        });
        let said = repair(&wide.image);
        assert!(said.contains("extent map rebuilt"), "{said}");
        frag_reads_back(&wide, &lost);
    }
}

// An inode whose spare bytes are not zero (CRC recomputed) is refused by the verifiers; repair
// clears them and keeps the inode and its data.
#[test]
fn inode_spare_bytes_are_cleared() {
    let wide = wide();
    let g = wide.image.geometry;
    let (block, offset) = g.inode_position(InodeNumber(wide.frag)).unwrap();
    let at = g.byte_offset(block) + offset as u64;
    let mut raw = common::read_bytes(&wide.image.path, at, g.inode_size as usize);
    raw[170] = 0x5a;
    cairn_format::header::stamp(&mut raw, None);
    common::write_bytes(&wide.image.path, at, &raw);
    let checked = fsck(&["-n", wide.image.path.to_str().unwrap()]);
    assert!(
        text(&checked).contains("reserved bytes are not zero"),
        "{}",
        text(&checked)
    );
    let said = repair(&wide.image);
    assert!(said.contains("spare bytes cleared"), "{said}");
    frag_reads_back(&wide, &[]);
}

// Flags and hints an inode may not carry (CRC recomputed): a directory flag on a file, a
// hint on a directory without EXTSIZE_INHERIT, unknown flag bits, a hint above half an AG,
// the same two for the CoW extent size hint.
// `-n` names each; `-y` clears just those and keeps the inode, its other flags, its
// project id and its data.
#[test]
fn damaged_flags_and_hints_are_cleared() {
    use cairn_format::inode::{INODE_FLAG_NODUMP, INODE_FLAG_PROJECT_INHERIT};
    type Edit = fn(&mut cairn_format::inode::InodeCore, u32);
    let edits: [(&str, Edit, &str); 6] = [
        (
            "f1",
            |core, _| core.flags |= INODE_FLAG_PROJECT_INHERIT,
            "inheriting flags",
        ),
        ("a", |core, _| core.extent_size_hint = 16, "cannot use it"),
        ("f1", |core, _| core.flags |= 1 << 12, "unknown inode flags"),
        (
            "f1",
            |core, ag| core.extent_size_hint = ag / 2 + 1,
            "above half an AG",
        ),
        (
            "a",
            |core, _| core.cow_extent_size_hint = 16,
            "cannot use it",
        ),
        (
            "f1",
            |core, ag| core.cow_extent_size_hint = ag / 2 + 1,
            "above half an AG",
        ),
    ];
    for (which, edit, want) in edits {
        let image = common::populated();
        let inode = if which == "a" { image.a } else { image.f1 };
        let ag_blocks = image.geometry.ag_blocks;
        common::edit_inode(&image, inode, |core, _| {
            core.flags |= INODE_FLAG_NODUMP;
            core.project_id = 9;
            edit(core, ag_blocks);
        });
        let checked = fsck(&["-n", image.path.to_str().unwrap()]);
        assert!(text(&checked).contains(want), "{want}: {}", text(&checked));
        let said = repair(&image);
        assert!(said.contains("cleared"), "{said}");
        let (_device, fs) = mount_file(&image.path);
        let kept = fs.file_attributes(inode).unwrap().attributes;
        assert!(
            kept.flags.no_dump && !kept.flags.project_inherit,
            "{kept:?}"
        );
        assert_eq!((kept.project_id, kept.extent_size_hint), (9, 0));
        assert_eq!(kept.cow_extent_size_hint, 0);
        if which == "f1" {
            assert_eq!(fs.read(inode, 0, 10240).unwrap(), vec![7u8; 10240]);
        }
        fs.unmount().unwrap();
        common::mounts(&image.path);
    }
}

// An AGI whose newest_inode is off by 8 (not the first inode of a chunk), or a superblock
// copy and an AGF with nonzero spare bytes, are found by `-n` and rewritten by `-y`.
#[test]
fn reserved_fields_and_newest_inode_are_repaired() {
    let g = common::populated().geometry;
    type Edit = fn(&mut [u8]);
    let edits: [(u64, Edit, &str); 3] = [
        (
            2,
            |raw| put_u32(raw, 80, get_u32(raw, 80) + 8),
            "newest_inode",
        ),
        (u64::from(g.ag_blocks), |raw| raw[200] = 1, "reserved"),
        (1, |raw| raw[110] = 1, "spare"),
    ];
    for (block, edit, want) in edits {
        let image = common::populated();
        edit_block(&image, block, edit);
        let checked = fsck(&["-n", image.path.to_str().unwrap()]);
        assert!(text(&checked).contains(want), "{want}: {}", text(&checked));
        repair(&image);
        common::mounts(&image.path);
    }
}

// A name of the wide directory changed (CRC recomputed) into another entry's name: the
// entry the index does not file under that name is removed and its file moved to
// /lost+found; the other keeps the name.
#[test]
fn duplicate_name_goes_to_lost_found() {
    let wide = wide();
    let victim = wide_inode(&wide, 601);
    let size = u64::from(wide.image.geometry.block_size);
    let block = owned_blocks(&wide.image, MetaKind::DirData, wide.wide)
        .into_iter()
        .find(|&b| {
            let raw = common::read_bytes(&wide.image.path, b * size, size as usize);
            cairn_format::dir::dir_data_entries(&raw)
                .unwrap()
                .iter()
                .any(|e| e.name == b"name-00601")
        })
        .unwrap();
    edit_block(&wide.image, block, |raw| {
        let entry = cairn_format::dir::dir_data_entries(raw)
            .unwrap()
            .into_iter()
            .find(|e| e.name == b"name-00601")
            .unwrap();
        let at = usize::from(entry.offset) + 10;
        raw[at..at + 10].copy_from_slice(b"name-00600");
    });
    let said = repair(&wide.image);
    assert!(said.contains("its name is another entry's"), "{said}");
    let (_device, fs) = mount_file(&wide.image.path);
    let lost_found = fs.lookup(fs.root(), b"lost+found").unwrap().inode;
    let moved = fs
        .lookup(lost_found, victim.to_string().as_bytes())
        .unwrap();
    assert_eq!(moved.inode, victim);
    assert_ne!(fs.lookup(wide.wide, b"name-00600").unwrap().inode, victim);
    fs.unmount().unwrap();
}

// The newest log record (the clean unmount record) names tail 0 with its CRC recomputed:
// recovery could not start from there, so `-n` reports it and `-y` replaces the log with a
// clean one; the filesystem then takes a new file and checks clean after its unmount.
#[test]
fn log_whose_newest_record_names_no_tail_is_discarded() {
    let image = common::populated();
    let g = image.geometry;
    let bytes = std::fs::read(&image.path).unwrap();
    let size = g.block_size as usize;
    let newest = (0..u64::from(g.log_blocks))
        .map(|index| g.log_start + index)
        .filter_map(|block| {
            let at = block as usize * size;
            let (header, _) = decode_log_record(&bytes[at..at + size]).ok()?;
            Some((header.lsn, block))
        })
        .max()
        .unwrap()
        .1;
    let at = newest * size as u64;
    let mut sector = common::read_bytes(&image.path, at, LOG_RECORD_HEADER_BYTES);
    put_u64(&mut sector, 72, 0);
    let crc = log_header_crc(&sector);
    put_u32(&mut sector, 4, crc);
    common::write_bytes(&image.path, at, &sector);
    let path = image.path.to_str().unwrap();
    let checked = fsck(&["-n", path]);
    assert!(
        text(&checked).contains("where no record is"),
        "{}",
        text(&checked)
    );
    let said = repair(&image);
    assert!(said.contains("DISCARDED"), "{said}");
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"after", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.write(file.inode, 0, &[1u8; 5000]).unwrap();
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    let checked = fsck(&["-n", path]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));
}
