//! Repair: for each kind of damage, `-n` finds it (exit 4), `-y` repairs it (exit 1), `-n`
//! then finds the image clean (exit 0), and cairn-fs mounts the result and reads what should
//! have survived.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::agf::Agf;
use cairn_format::dir::ShortformDir;
use cairn_format::inode::{InodeCore, fork_extents, put_fork_extents};
use cairn_format::limits::{AG_AGF_BLOCK, AG_AGFL_BLOCK, AG_AGI_BLOCK};
use cairn_format::log::{LOG_RECORD_HEADER_BYTES, decode_log_record, encode_log_record};
use cairn_format::{AgBlock, AgNumber, FsBlock, InodeNumber, MetaKind, OnDisk};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions, RenameMode, XattrFlags};
use common::{Image, SECTOR, blocks_with_magic, edit_block, edit_inode, populated, text};

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

/// The populated image plus a file with an extent tree, one with an xattr leaf block and a
/// symlink with a block-sized target.
struct Rich {
    image: Image,
    fragmented: u64,
    with_xattr: u64,
    link: u64,
}

fn mount_file(path: &Path) -> (Arc<MemDevice>, Filesystem) {
    let device = Arc::new(MemDevice::from_image(std::fs::read(path).unwrap(), SECTOR).unwrap());
    let fs = Filesystem::mount(device.clone(), MountOptions::default()).unwrap();
    (device, fs)
}

fn rich() -> Rich {
    let image = populated();
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let root = fs.root();
    let fragmented = fs
        .create(root, b"frag", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    let block = u64::from(image.geometry.block_size);
    for index in 0..80u64 {
        fs.write(
            fragmented,
            2 * index * block,
            &vec![index as u8 + 1; block as usize],
        )
        .unwrap();
        fs.fsync(fragmented, false).unwrap();
    }
    let with_xattr = fs
        .create(root, b"xa", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    fs.setxattr(with_xattr, b"user.big", &[9u8; 1500], XattrFlags::Any, &who)
        .unwrap();
    let target = vec![b't'; 1000];
    let link = fs.symlink(root, b"link", &target, &who).unwrap().inode;
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    Rich {
        image,
        fragmented,
        with_xattr,
        link,
    }
}

/// `-n` finds the damage, `-y` repairs it, `-n` is then clean; returns `-y`'s output.
fn repair_cycle(image: &Image, want: &str) -> String {
    let path = image.path.to_str().unwrap();
    let found = fsck(&["-n", path]);
    let said = text(&found);
    assert_eq!(found.status.code(), Some(4), "-n before:\n{said}");
    assert!(said.contains(want), "want {want:?} in\n{said}");
    let repaired = fsck(&["-y", path]);
    let done = text(&repaired);
    assert_eq!(repaired.status.code(), Some(1), "-y:\n{done}");
    assert!(!done.contains("panicked"), "{done}");
    let again = fsck(&["-n", path]);
    assert_eq!(
        again.status.code(),
        Some(0),
        "-n after:\n{}\n-y said:\n{done}",
        text(&again)
    );
    common::mounts(&image.path);
    done
}

/// Reads file `name` of the root through cairn-fs.
fn read_root_file(path: &Path, name: &[u8], len: u32) -> Vec<u8> {
    let (_device, fs) = mount_file(path);
    let inode = fs.lookup(fs.root(), name).unwrap().inode;
    let data = fs.read(inode, 0, len).unwrap();
    fs.unmount().unwrap();
    data
}

fn flip(image: &Image, block: u64, within: u64) {
    let at = block * u64::from(image.geometry.block_size) + within;
    let mut byte = common::read_bytes(&image.path, at, 1);
    byte[0] ^= 0x40;
    common::write_bytes(&image.path, at, &byte);
}

fn ag_block(image: &Image, ag: u32, block: u32) -> u64 {
    image.geometry.fs_block(AgNumber(ag), AgBlock(block)).0
}

fn agf(image: &Image, ag: u32) -> Agf {
    let at = ag_block(image, ag, AG_AGF_BLOCK);
    let size = image.geometry.block_size as usize;
    let raw = common::read_bytes(&image.path, at * size as u64, size);
    Agf::decode(&raw).unwrap()
}

fn data_extents(image: &Image, inode: u64) -> Vec<cairn_format::Extent> {
    let g = image.geometry;
    let (block, offset) = g.inode_position(InodeNumber(inode)).unwrap();
    let raw = common::read_bytes(
        &image.path,
        g.byte_offset(block) + offset as u64,
        g.inode_size as usize,
    );
    let core = InodeCore::decode(&raw).unwrap();
    fork_extents(
        &raw[core.data_fork_range(g.inode_size)],
        core.data_extent_count,
    )
    .unwrap()
}

// A bad CRC in each per-AG header (secondary superblock, AGF, AGI, AGFL) is repaired.
#[test]
fn bad_crc_in_ag_headers() {
    for (ag, block, name) in [
        (1, 0, MetaKind::Superblock.name()),
        (1, AG_AGF_BLOCK, MetaKind::Agf.name()),
        (0, AG_AGI_BLOCK, MetaKind::Agi.name()),
        (1, AG_AGI_BLOCK, MetaKind::Agi.name()),
        (0, AG_AGFL_BLOCK, MetaKind::Agfl.name()),
    ] {
        let image = populated();
        flip(&image, ag_block(&image, ag, block), 100);
        repair_cycle(&image, name);
        assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
    }
}

// A bad CRC in the primary superblock: -y rebuilds it from the secondary copies.
#[test]
fn bad_crc_in_primary_superblock() {
    let image = populated();
    flip(&image, 0, 100);
    let said = repair_cycle(&image, "superblock");
    assert!(said.contains("superblock: primary:"), "{said}");
    assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
}

// A primary whose CRC holds but whose fields are wrong: an ag_count that disagrees with the
// block counts (it does not decode), or a block count the copies outvote.
#[test]
fn primary_superblock_with_a_wrong_field() {
    let wrong_ag_count = |raw: &mut [u8]| {
        let ag_count = u32::from_le_bytes(raw[76..80].try_into().unwrap());
        raw[76..80].copy_from_slice(&(ag_count + 1).to_le_bytes());
    };
    let wrong_block_count = |raw: &mut [u8]| {
        let blocks = u64::from_le_bytes(raw[64..72].try_into().unwrap());
        raw[64..72].copy_from_slice(&(blocks - 1).to_le_bytes());
    };
    for (edit, want) in [
        (&wrong_ag_count as &dyn Fn(&mut [u8]), "ag_count"),
        (&wrong_block_count, "disagrees with the primary"),
    ] {
        let image = populated();
        edit_block(&image, 0, edit);
        let said = repair_cycle(&image, want);
        assert!(said.contains("superblock: primary:"), "{said}");
        assert_eq!(common::superblock(&image.path).geometry, image.geometry);
        assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
    }
}

// With two AGs the primary and its one copy tie; the one the AG headers, the root inode
// and the log agree with wins, whichever of the two was changed (with its CRC recomputed).
#[test]
fn primary_and_copy_tie_in_two_ags() {
    let field = |offset: usize, delta: u64| {
        move |raw: &mut [u8]| {
            let value = u32::from_le_bytes(raw[offset..offset + 4].try_into().unwrap());
            let value = u64::from(value).wrapping_add(delta) as u32;
            raw[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
        }
    };
    let uuid = |raw: &mut [u8]| raw[24] ^= 0x40;
    let root_inode = |raw: &mut [u8]| raw[120] ^= 1;
    type Edit<'a> = &'a dyn Fn(&mut [u8]);
    let edits: [(Edit, &str); 3] = [
        (&field(72, 1), "ag_blocks + 1"),
        (&uuid, "uuid"),
        (&root_inode, "root_inode"),
    ];
    for (edit, what) in edits {
        for damaged_copy in [false, true] {
            let image = common::populated_in(Some(2));
            let at = if damaged_copy {
                u64::from(image.geometry.ag_blocks)
            } else {
                0
            };
            edit_block(&image, at, edit);
            let path = image.path.to_str().unwrap();
            let repaired = fsck(&["-y", path]);
            let said = text(&repaired);
            assert_eq!(
                repaired.status.code(),
                Some(1),
                "{what}, copy {damaged_copy}:\n{said}"
            );
            let again = fsck(&["-n", path]);
            assert_eq!(
                again.status.code(),
                Some(0),
                "{what}:\n{}\n{said}",
                text(&again)
            );
            assert_eq!(common::superblock(&image.path).geometry, image.geometry);
            assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
        }
    }
}

// A bad CRC in a free-space or inode tree block is repaired by rebuilding the trees.
#[test]
fn bad_crc_in_ag_trees() {
    for kind in [MetaKind::BnoBtree, MetaKind::CntBtree, MetaKind::InoBtree] {
        let image = populated();
        let magic = kind.magic().to_le_bytes();
        let block = blocks_with_magic(&image, &magic)[0];
        flip(&image, block, 200);
        repair_cycle(&image, kind.name());
        assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
    }
}

// A damaged inode (bad CRC in its cluster) is cleared and its entry removed.
#[test]
fn bad_crc_in_inode_cluster() {
    let image = populated();
    let g = image.geometry;
    let (block, offset) = g.inode_position(InodeNumber(image.f1)).unwrap();
    let at = g.byte_offset(block) + offset as u64 + 60;
    let mut byte = common::read_bytes(&image.path, at, 1);
    byte[0] ^= 1;
    common::write_bytes(&image.path, at, &byte);
    let said = repair_cycle(&image, "inode");
    assert!(
        said.contains(&format!("inode {}: cleared", image.f1)),
        "{said}"
    );
    assert!(said.contains("removed entry 'f1'"), "{said}");
    let (_device, fs) = mount_file(&image.path);
    assert!(fs.lookup(fs.root(), b"f1").is_err());
    assert!(fs.lookup(fs.root(), b"f2link").is_ok());
    fs.unmount().unwrap();
}

// A directory data block with a bad CRC is salvaged: its entries are kept.
#[test]
fn bad_crc_in_directory_block() {
    let image = populated();
    let extents = data_extents(&image, image.big);
    let block = extents[0].fs_block.0;
    // Flip a byte of the header's spare area: the entries still decode.
    flip(&image, block, 61);
    repair_cycle(&image, MetaKind::DirData.name());
    let (_device, fs) = mount_file(&image.path);
    assert!(fs.lookup(image.big, b"entry-0000").is_ok());
    assert!(fs.lookup(image.big, b"entry-0299").is_ok());
    fs.unmount().unwrap();
}

// The hash index block of a directory with a bad CRC is rebuilt from the entries.
#[test]
fn bad_crc_in_directory_index() {
    let image = populated();
    let magic = MetaKind::DirBtree.magic().to_le_bytes();
    let block = blocks_with_magic(&image, &magic)[0];
    flip(&image, block, 100);
    repair_cycle(&image, MetaKind::DirBtree.name());
    let (_device, fs) = mount_file(&image.path);
    assert!(fs.lookup(image.big, b"entry-0150").is_ok());
    fs.unmount().unwrap();
}

// An extent tree leaf with a bad CRC: its extents are lost (the file reads zeros there)
// but the file stays, with its size, and its map is stored anew.
#[test]
fn bad_crc_in_extent_tree_block() {
    let rich = rich();
    let magic = MetaKind::BmapBtree.magic().to_le_bytes();
    let block = blocks_with_magic(&rich.image, &magic)[0];
    flip(&rich.image, block, 100);
    let said = repair_cycle(&rich.image, MetaKind::BmapBtree.name());
    assert!(
        said.contains(&format!("inode {}: extent map rebuilt", rich.fragmented)),
        "{said}"
    );
    let (_device, fs) = mount_file(&rich.image.path);
    let attr = fs.getattr(rich.fragmented).unwrap();
    assert_eq!(attr.size, 159 * u64::from(rich.image.geometry.block_size));
    let data = fs.read(rich.fragmented, 0, 4096).unwrap();
    assert!(data.iter().all(|&b| b == 0));
    fs.unmount().unwrap();
}

// An xattr leaf with a bad CRC: the attributes are dropped, the file's data kept.
#[test]
fn bad_crc_in_xattr_block() {
    let rich = rich();
    let magic = MetaKind::AttrBlock.magic().to_le_bytes();
    let block = blocks_with_magic(&rich.image, &magic)[0];
    flip(&rich.image, block, 100);
    let said = repair_cycle(&rich.image, MetaKind::AttrBlock.name());
    assert!(
        said.contains(&format!("inode {}: dropped", rich.with_xattr)),
        "{said}"
    );
    let (_device, fs) = mount_file(&rich.image.path);
    assert!(fs.lookup(fs.root(), b"xa").is_ok());
    assert!(fs.readlink(rich.link).is_ok());
    fs.unmount().unwrap();
}

/// The one remote target block of `rich`'s symlink.
fn symlink_block(rich: &Rich) -> u64 {
    let extents = data_extents(&rich.image, rich.link);
    assert_eq!(extents.len(), 1);
    extents[0].fs_block.0
}

// A symlink block whose header is damaged but whose target piece is intact is salvaged: the
// header is rewritten, the target kept.
#[test]
fn symlink_block_with_a_bad_header_is_salvaged() {
    let rich = rich();
    let block = symlink_block(&rich);
    // The owner field names another inode (the CRC re-stamped): only the header is wrong.
    edit_block(&rich.image, block, |raw| {
        raw[40..48].copy_from_slice(&rich.fragmented.to_le_bytes());
    });
    let said = repair_cycle(&rich.image, MetaKind::SymlinkBlock.name());
    assert!(said.contains("target block"), "{said}");
    let (_device, fs) = mount_file(&rich.image.path);
    assert_eq!(fs.readlink(rich.link).unwrap(), vec![b't'; 1000]);
    fs.unmount().unwrap();
    // A bad CRC (a flipped header byte) is salvaged the same way.
    let rich = self::rich();
    flip(&rich.image, symlink_block(&rich), 9);
    repair_cycle(&rich.image, MetaKind::SymlinkBlock.name());
    let (_device, fs) = mount_file(&rich.image.path);
    assert_eq!(fs.readlink(rich.link).unwrap(), vec![b't'; 1000]);
    fs.unmount().unwrap();
}

// A symlink block whose piece disagrees with the inode's size cannot be saved: the symlink
// is cleared and its entry removed.
#[test]
fn symlink_block_with_a_bad_length_is_cleared() {
    let rich = rich();
    let block = symlink_block(&rich);
    edit_block(&rich.image, block, |raw| {
        raw[52..56].copy_from_slice(&999u32.to_le_bytes());
    });
    let said = repair_cycle(&rich.image, "does not hold bytes 0..1000");
    assert!(
        said.contains(&format!("inode {}: cleared", rich.link)),
        "{said}"
    );
    assert!(said.contains("removed entry 'link'"), "{said}");
    let (_device, fs) = mount_file(&rich.image.path);
    assert!(fs.lookup(fs.root(), b"link").is_err());
    assert!(fs.lookup(fs.root(), b"xa").is_ok());
    fs.unmount().unwrap();
}

// Without the reflink feature, a block claimed by two files stays with the lower inode; the
// other gets a copy (as e2fsck clones multiply-claimed blocks), so both read what they read
// before. (With it, the files share the blocks: `refcount.rs`.)
#[test]
fn block_claimed_twice() {
    let image = common::populated_without_reflink();
    let extents = data_extents(&image, image.f1);
    let inode_size = image.geometry.inode_size;
    edit_inode(&image, image.f2, |core, fork| {
        let len = core.data_fork_range(inode_size).len();
        put_fork_extents(&extents, &mut fork[..len]).unwrap();
        core.data_extent_count = extents.len() as u32;
        core.block_count = extents.iter().map(|e| u64::from(e.length)).sum();
        core.size = 10240;
    });
    let said = repair_cycle(&image, "claimed by both");
    assert!(
        said.contains(&format!("inode {}: blocks", image.f2)) && said.contains("copied"),
        "{said}"
    );
    assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
    assert_eq!(
        read_root_file(&image.path, b"f2link", 10240),
        vec![7u8; 10240]
    );
}

// A block no structure owns (leaked) goes back to free space; a wrong AGF free count is set.
#[test]
fn leaked_block_and_bad_free_count() {
    let image = populated();
    let agf1 = agf(&image, 1);
    let bno = ag_block(&image, 1, agf1.bno_root.0);
    let cnt = ag_block(&image, 1, agf1.cnt_root.0);
    // The first record of each (one-leaf) tree loses its last block.
    for block in [bno, cnt] {
        edit_block(&image, block, |raw| {
            let length = u32::from_le_bytes(raw[76..80].try_into().unwrap());
            raw[76..80].copy_from_slice(&(length - 1).to_le_bytes());
        });
    }
    repair_cycle(&image, "belong to nothing");
    let image = populated();
    let at = ag_block(&image, 0, AG_AGF_BLOCK);
    edit_block(&image, at, |raw| {
        let mut agf = Agf::decode(raw).unwrap();
        agf.free_blocks += 5;
        agf.encode(raw);
    });
    repair_cycle(&image, "free_blocks is");
}

// A wrong link count is set to the entries naming the file.
#[test]
fn wrong_link_count() {
    let image = populated();
    edit_inode(&image, image.f1, |core, _| core.nlink = 5);
    let said = repair_cycle(&image, "has link count 5, expected 1");
    assert!(said.contains("link count 5 set to 1"), "{said}");
}

/// Removes the entry `name` from the short-form root directory of `image`.
fn remove_root_entry(image: &Image, name: &[u8]) {
    edit_inode(image, image.root, |core, fork| {
        let mut sf = ShortformDir::decode(&fork[..core.size as usize]).unwrap();
        sf.entries.retain(|e| e.name != name);
        let bytes = sf.encode().unwrap();
        fork.fill(0);
        fork[..bytes.len()].copy_from_slice(&bytes);
        core.size = bytes.len() as u64;
    });
}

// A directory cut off from the root goes to /lost+found under its inode number.
#[test]
fn disconnected_directory() {
    let image = populated();
    remove_root_entry(&image, b"a");
    let said = repair_cycle(&image, "not reachable from the root");
    assert!(said.contains("moved to /lost+found"), "{said}");
    let (_device, fs) = mount_file(&image.path);
    let lost = fs.lookup(fs.root(), b"lost+found").unwrap();
    assert_eq!(lost.mode & 0o7777, 0o700);
    let a = fs
        .lookup(lost.inode, image.a.to_string().as_bytes())
        .unwrap();
    assert_eq!(a.inode, image.a);
    assert!(fs.lookup(a.inode, b"b").is_ok());
    fs.unmount().unwrap();
}

// A directory cut off from the root that holds a directory of a lower inode number: the
// top of the cut-off subtree goes to /lost+found and the directory below stays in it (it
// used to go first, cut from its parent as if in a cycle).
#[test]
fn disconnected_subtree_moves_whole() {
    let image = populated();
    assert!(image.a < image.big);
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    fs.rename(
        fs.root(),
        b"a",
        image.big,
        b"a",
        RenameMode::NoReplace,
        &who,
    )
    .unwrap();
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    remove_root_entry(&image, b"big");
    let said = repair_cycle(&image, "not reachable from the root");
    assert!(!said.contains("cycle"), "{said}");
    assert!(
        !said.contains(&format!("inode {}: disconnected", image.a)),
        "{said}"
    );
    let (_device, fs) = mount_file(&image.path);
    let lost = fs.lookup(fs.root(), b"lost+found").unwrap().inode;
    let big = fs.lookup(lost, image.big.to_string().as_bytes()).unwrap();
    let a = fs.lookup(big.inode, b"a").unwrap();
    assert_eq!(a.inode, image.a);
    assert!(fs.lookup(a.inode, b"b").is_ok());
    fs.unmount().unwrap();
}

// Three hundred disconnected files do not fit a short-form /lost+found: it is rewritten in
// block form with a hash index, and every file is attached. A directory disconnected later
// is added to the block-form /lost+found.
#[test]
fn many_disconnected_files_go_to_a_block_form_lost_found() {
    let image = populated();
    // `big` forgets its 300 entries: it becomes an empty short-form directory.
    forget_entries(&image, image.big, image.root);
    let said = repair_cycle(&image, "no directory names it");
    assert!(
        said.contains("rewritten in block form with 300 entries"),
        "{said}"
    );
    let (_device, fs) = mount_file(&image.path);
    let lost = fs.lookup(fs.root(), b"lost+found").unwrap().inode;
    let listed = fs.readdir(lost, 0, 1000).unwrap();
    assert_eq!(listed.len(), 302, "300 files, '.' and '..'");
    let first = fs.lookup(lost, (image.big + 1).to_string().as_bytes());
    assert!(first.is_ok());
    fs.unmount().unwrap();
    remove_root_entry(&image, b"a");
    let said = repair_cycle(&image, "not reachable from the root");
    assert!(
        said.contains("rewritten in block form with 301 entries"),
        "{said}"
    );
    let (_device, fs) = mount_file(&image.path);
    let lost = fs.lookup(fs.root(), b"lost+found").unwrap().inode;
    let a = fs.lookup(lost, image.a.to_string().as_bytes()).unwrap();
    assert!(fs.lookup(a.inode, b"f2").is_ok());
    assert_eq!(fs.readdir(lost, 0, 1000).unwrap().len(), 303);
    fs.unmount().unwrap();
}

/// Makes directory `dir` an empty short-form directory (its entries forgotten).
fn forget_entries(image: &Image, dir: u64, parent: u64) {
    edit_inode(image, dir, |core, fork| {
        let bytes = ShortformDir {
            parent,
            entries: Vec::new(),
        }
        .encode()
        .unwrap();
        fork.fill(0);
        fork[..bytes.len()].copy_from_slice(&bytes);
        core.data_format = cairn_format::inode::ForkFormat::Local;
        core.data_extent_count = 0;
        core.block_count = 0;
        core.size = bytes.len() as u64;
    });
}

// More disconnected files than one index leaf holds: /lost+found gets a two-level hash
// index, which cairn-fs then looks names up in and adds entries to.
#[test]
fn lost_found_with_a_two_level_index() {
    let image = populated();
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let many = fs.mkdir(fs.root(), b"many", 0o755, &who).unwrap().inode;
    let mut files = Vec::new();
    for index in 0..700 {
        let name = format!("file-{index:04}");
        let file = fs.create(many, name.as_bytes(), FileKind::Regular, 0o644, 0, &who);
        files.push(file.unwrap().inode);
    }
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    forget_entries(&image, many, image.root);
    let said = repair_cycle(&image, "no directory names it");
    assert!(
        said.contains("rewritten in block form with 700 entries"),
        "{said}"
    );
    let (_device, fs) = mount_file(&image.path);
    let lost = fs.lookup(fs.root(), b"lost+found").unwrap().inode;
    for &file in &files {
        let found = fs.lookup(lost, file.to_string().as_bytes()).unwrap();
        assert_eq!(found.inode, file);
    }
    fs.create(lost, b"added-later", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    assert!(fs.lookup(lost, b"added-later").is_ok());
    fs.unmount().unwrap();
}

// An entry naming a free inode is removed.
#[test]
fn dangling_entry() {
    let image = populated();
    edit_inode(&image, image.b, |core, fork| {
        core.mode = 0;
        core.nlink = 0;
        core.size = 0;
        core.data_format = cairn_format::inode::ForkFormat::Extents;
        core.data_extent_count = 0;
        fork.fill(0);
    });
    let said = repair_cycle(&image, "not in use");
    assert!(said.contains("removed entry 'b'"), "{said}");
    let (_device, fs) = mount_file(&image.path);
    assert!(fs.lookup(image.a, b"b").is_err());
    assert!(fs.lookup(image.a, b"f2").is_ok());
    fs.unmount().unwrap();
}

// An extent past the end of the device is dropped from its file.
#[test]
fn extent_past_the_device() {
    let image = populated();
    let end = image.geometry.block_count;
    edit_inode(&image, image.f1, |core, fork| {
        let mut extents = fork_extents(fork, core.data_extent_count).unwrap();
        extents[0].fs_block = FsBlock(end - 1);
        put_fork_extents(&extents, fork).unwrap();
    });
    let said = repair_cycle(&image, "past the device");
    assert!(said.contains("past the end of the device"), "{said}");
}

// A mounted (held) device is refused by -y with exit 8, and nothing is written.
#[test]
fn held_device_is_refused() {
    let image = populated();
    let holder = cairn::LockHolder::new(&image.path);
    let before = std::fs::read(&image.path).unwrap();
    let out = fsck(&["-y", image.path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("pid {}", holder.pid())),
        "{}",
        text(&out)
    );
    drop(holder);
    assert_eq!(std::fs::read(&image.path).unwrap(), before);
}

// A dirty log is replayed by -y (through cairn-fs): the fsynced file survives.
#[test]
fn dirty_log_is_replayed() {
    let image = dirty_log_image();
    let said = repair_cycle(&image, "never replayed");
    assert!(said.contains("log: replayed"), "{said}");
    assert_eq!(read_root_file(&image.path, b"new", 4), b"kept");
}

/// Makes the image's log dirty: a file `new` holding `kept`, fsynced, then a crash.
fn dirty_log_image() -> common::Image {
    let image = populated();
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"new", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.write(file.inode, 0, b"kept").unwrap();
    fs.fsync(file.inode, false).unwrap();
    std::fs::write(&image.path, device.durable_image()).unwrap();
    drop(fs);
    image
}

// A dirty log behind a damaged primary superblock: the primary is rebuilt first, then the
// log is replayed (not discarded), so the fsynced file survives.
#[test]
fn dirty_log_behind_a_bad_primary_superblock_is_replayed() {
    let image = dirty_log_image();
    flip(&image, 0, 100);
    let said = repair_cycle(&image, "superblock");
    assert!(said.contains("superblock: primary:"), "{said}");
    assert!(said.contains("log: replayed"), "{said}");
    assert!(!said.contains("DISCARDED"), "{said}");
    assert_eq!(read_root_file(&image.path, b"new", 4), b"kept");
}

// A dirty log whose mount fails on damaged metadata (an AGF and an AGI the mount reads after
// replay) is replayed through the journal alone, not discarded; the metadata is repaired.
#[test]
fn dirty_log_behind_damaged_ag_headers_is_replayed() {
    let image = dirty_log_image();
    for ag in 0..image.geometry.ag_count {
        flip(&image, ag_block(&image, ag, AG_AGF_BLOCK), 100);
        flip(&image, ag_block(&image, ag, AG_AGI_BLOCK), 100);
    }
    let path = image.path.to_str().unwrap();
    let dev = Arc::new(MemDevice::from_image(std::fs::read(path).unwrap(), SECTOR).unwrap());
    assert!(Filesystem::mount(dev, MountOptions::default()).is_err());
    let said = repair_cycle(&image, MetaKind::Agf.name());
    assert!(said.contains("through the journal alone"), "{said}");
    assert!(!said.contains("DISCARDED"), "{said}");
    assert_eq!(read_root_file(&image.path, b"new", 4), b"kept");
}

// -L (discard the log whatever stopped its replay) only goes with -y.
#[test]
fn discard_log_needs_yes() {
    let image = populated();
    let path = image.path.to_str().unwrap();
    for args in [
        vec!["-L", path],
        vec!["-p", "-L", path],
        vec!["-n", "-L", path],
    ] {
        let out = fsck(&args);
        assert_eq!(out.status.code(), Some(16), "{args:?}: {}", text(&out));
    }
    let out = fsck(&["-y", "-L", path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Makes every record of the image's log whose payload holds items undecodable (an unknown
/// item type) with valid CRCs, so replay fails; returns how many were damaged.
fn damage_log_items(image: &Image) -> usize {
    let g = image.geometry;
    let block = g.block_size as usize;
    let start = g.byte_offset(FsBlock(g.log_start)) as usize;
    let mut bytes = std::fs::read(&image.path).unwrap();
    let log = &mut bytes[start..start + g.log_blocks as usize * block];
    let mut damaged = 0;
    let mut at = 0;
    while at < log.len() {
        let Ok((header, payload)) = decode_log_record(&log[at..]) else {
            at += block;
            continue;
        };
        let len = LOG_RECORD_HEADER_BYTES + payload.len();
        if header.op_count > 0 {
            let mut payload = payload.to_vec();
            payload[..2].copy_from_slice(&0x7777u16.to_le_bytes());
            let record = encode_log_record(&header, &payload);
            log[at..at + record.len()].copy_from_slice(&record);
            damaged += 1;
        }
        at += len.next_multiple_of(block);
    }
    std::fs::write(&image.path, bytes).unwrap();
    damaged
}

// A dirty log whose records cannot be replayed is discarded by -y, loudly; the state before
// the log (everything written home) is kept, and the new log starts past every metadata LSN.
#[test]
fn corrupt_log_is_discarded() {
    let image = populated();
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"new", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.write(file.inode, 0, b"lost").unwrap();
    fs.fsync(file.inode, false).unwrap();
    std::fs::write(&image.path, device.durable_image()).unwrap();
    drop(fs);
    assert!(damage_log_items(&image) > 0);
    let path = image.path.to_str().unwrap();
    let found = fsck(&["-n", path]);
    assert_eq!(found.status.code(), Some(4), "{}", text(&found));
    assert!(text(&found).contains("do not decode"), "{}", text(&found));
    let said = repair_cycle(&image, "never replayed");
    assert!(said.contains("WARNING: log: replay failed"), "{said}");
    assert!(said.contains("are LOST"), "{said}");
    assert_eq!(read_root_file(&image.path, b"f1", 10240), vec![7u8; 10240]);
    let (device, fs) = mount_file(&image.path);
    assert!(fs.lookup(image.big, b"entry-0299").is_ok());
    assert!(fs.lookup(image.a, b"b").is_ok());
    // The repaired filesystem logs new changes and replays them after a crash.
    let kept = fs
        .create(fs.root(), b"after", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.write(kept.inode, 0, b"kept").unwrap();
    fs.fsync(kept.inode, false).unwrap();
    std::fs::write(&image.path, device.durable_image()).unwrap();
    drop(fs);
    assert_eq!(read_root_file(&image.path, b"after", 4), b"kept");
}

// -p repairs what loses nothing (a link count) but leaves a dangling entry (exit 4).
#[test]
fn preen_repairs_only_what_is_safe() {
    let image = populated();
    edit_inode(&image, image.f1, |core, _| core.nlink = 5);
    let path = image.path.to_str().unwrap();
    let out = fsck(&["-p", path]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(fsck(&["-n", path]).status.code(), Some(0));
    edit_inode(&image, image.b, |core, fork| {
        core.mode = 0;
        core.nlink = 0;
        core.size = 0;
        core.data_format = cairn_format::inode::ForkFormat::Extents;
        core.data_extent_count = 0;
        fork.fill(0);
    });
    let out = fsck(&["-p", path]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("run with -y"), "{}", text(&out));
}

/// The populated image plus a whiteout (`whiteout`, left by a rename of `moved`) and an
/// unnamed O_TMPFILE file with data, left open at the unmount, so on its unlinked list as a
/// crash would leave it; returns the image, the whiteout and the unnamed file.
fn with_container_objects() -> (Image, u64, u64) {
    let image = populated();
    let (device, fs) = mount_file(&image.path);
    let who = Credentials::root();
    let root = fs.root();
    fs.create(root, b"moved", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.rename_whiteout(root, b"moved", root, b"placed", RenameMode::Replace, &who)
        .unwrap();
    let whiteout = fs.lookup(root, b"moved").unwrap().inode;
    let unnamed = fs.tmpfile(root, 0o600, false, &who).unwrap().inode;
    fs.open(unnamed, true, false, false, &who).unwrap();
    fs.write(unnamed, 0, &[3; 20_000]).unwrap();
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    (image, whiteout, unnamed)
}

// A whiteout (character device 0/0) and an unnamed file on its unlinked list are clean; a
// whiteout with a size is found and repaired to size 0.
#[test]
fn whiteouts_and_unnamed_files() {
    let (image, whiteout, _) = with_container_objects();
    let out = fsck(&["-n", image.path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    edit_inode(&image, whiteout, |core, _| core.size = 4096);
    let said = repair_cycle(&image, "special files hold no data");
    assert!(said.contains("size"), "{said}");
}

// An unlinked bucket whose chain reaches an inode it may not hold (here the unnamed file,
// made free) is emptied by repair, as xfs_repair does; the image is then clean and mounts.
#[test]
fn a_broken_unlinked_bucket_is_emptied() {
    let (image, _, unnamed) = with_container_objects();
    edit_inode(&image, unnamed, |core, _| {
        core.mode = 0;
        core.nlink = 0;
        core.size = 0;
        core.block_count = 0;
        core.data_extent_count = 0;
    });
    let said = repair_cycle(&image, "is on an unlinked list but not in use");
    assert!(said.contains("unlinked bucket"), "{said}");
}
