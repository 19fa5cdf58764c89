#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Model-based test of the whole namespace and data API (names, data, fallocate, extended
//! attributes): random operation sequences run on the filesystem and on
//! `common::model::Model`, compared after every step; fsck after each case. More cases:
//! `PROPTEST_CASES=256 cargo test -p cairn-fs --test model`.

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{
    FallocateMode, FileKind, Filesystem, FsError, MountOptions, RenameMode, SetAttr, XattrFlags,
};
use common::model::{Model, Node, Outcome};
use common::{fsck_clean, make_device, mount, mount_with, root, write_behind};
use proptest::prelude::*;

const XATTR_NAMES: [&[u8]; 4] = [
    b"user.a",
    b"user.b",
    b"trusted.a-longer-attribute-name-xxxxxxxxxxxxxxxxxxxxxxxx",
    b"security.s",
];
/// Value lengths: empty, short form, leaf-local, remote.
const XATTR_LENGTHS: [usize; 4] = [0, 20, 300, 5000];

const NAMES: [&[u8]; 4] = [
    b"a",
    b"b",
    b"long-name-for-the-block-form-move-xxxxxxxx",
    b"d",
];

#[derive(Debug, Clone)]
enum Op {
    Create {
        dir: usize,
        name: usize,
    },
    Mkdir {
        dir: usize,
        name: usize,
    },
    Write {
        file: usize,
        block: u64,
        skip: u64,
        len: usize,
        byte: u8,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    /// A read of any range, checked at once: reads reuse one device buffer per thread,
    /// so a byte the read did not fill would show an earlier transfer's data.
    Read {
        file: usize,
        offset: u64,
        len: u32,
    },
    Link {
        file: usize,
        dir: usize,
        name: usize,
    },
    Unlink {
        dir: usize,
        name: usize,
    },
    Rmdir {
        dir: usize,
        name: usize,
    },
    Rename {
        from: (usize, usize),
        to: (usize, usize),
        mode: u8,
    },
    Fsync {
        file: usize,
    },
    Fallocate {
        file: usize,
        offset: u64,
        len: u64,
        mode: u8,
    },
    SetXattr {
        inode: usize,
        name: usize,
        length: usize,
        byte: u8,
    },
    RemoveXattr {
        inode: usize,
        name: usize,
    },
    Remount,
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        3 => (any::<usize>(), name.clone()).prop_map(|(dir, name)| Op::Create { dir, name }),
        2 => (any::<usize>(), name.clone()).prop_map(|(dir, name)| Op::Mkdir { dir, name }),
        3 => (any::<usize>(), 0..12u64, 0..4096u64, 1..6000usize, any::<u8>())
            .prop_map(|(file, block, skip, len, byte)| Op::Write { file, block, skip, len, byte }),
        1 => (any::<usize>(), 0..60_000u64).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => (any::<usize>(), 0..60_000u64, 1..70_000u32)
            .prop_map(|(file, offset, len)| Op::Read { file, offset, len }),
        1 => (any::<usize>(), any::<usize>(), name.clone())
            .prop_map(|(file, dir, name)| Op::Link { file, dir, name }),
        2 => (any::<usize>(), name.clone()).prop_map(|(dir, name)| Op::Unlink { dir, name }),
        1 => (any::<usize>(), name.clone()).prop_map(|(dir, name)| Op::Rmdir { dir, name }),
        3 => ((any::<usize>(), name.clone()), (any::<usize>(), name), 0..3u8)
            .prop_map(|(from, to, mode)| Op::Rename { from, to, mode }),
        1 => any::<usize>().prop_map(|file| Op::Fsync { file }),
        2 => (any::<usize>(), 0..60_000u64, 1..30_000u64, 0..7u8)
            .prop_map(|(file, offset, len, mode)| Op::Fallocate { file, offset, len, mode }),
        2 => (any::<usize>(), 0..XATTR_NAMES.len(), 0..XATTR_LENGTHS.len(), any::<u8>())
            .prop_map(|(inode, name, length, byte)| Op::SetXattr { inode, name, length, byte }),
        1 => (any::<usize>(), 0..XATTR_NAMES.len())
            .prop_map(|(inode, name)| Op::RemoveXattr { inode, name }),
        1 => Just(Op::Remount),
    ]
}

fn pick(list: &[u64], index: usize) -> Option<u64> {
    (!list.is_empty()).then(|| list[index % list.len()])
}

/// Runs one operation on both sides and compares the outcomes.
fn step(fs: &Filesystem, model: &mut Model, op: &Op) {
    let who = root();
    let dirs = model.dirs();
    let files = model.files();
    match *op {
        Op::Create { dir, name } | Op::Mkdir { dir, name } => {
            let dir = pick(&dirs, dir).unwrap();
            let name = NAMES[name];
            let real = match op {
                Op::Create { .. } => fs.create(dir, name, FileKind::Regular, 0o644, 0, &who),
                _ => fs.mkdir(dir, name, 0o755, &who),
            };
            let expected = match model.entry(dir, name) {
                Some(_) => Outcome::Exists,
                None => Outcome::Ok,
            };
            assert_eq!(Outcome::of(&real), expected, "{op:?}");
            if let Ok(attr) = real {
                fs.forget(attr.inode, 1);
                let node = match attr.kind {
                    FileKind::Directory => Node::Dir {
                        entries: Default::default(),
                        parent: dir,
                    },
                    _ => Node::File {
                        data: Vec::new(),
                        nlink: 1,
                    },
                };
                model.add(dir, name, attr.inode, node);
            }
        }
        Op::Write {
            file,
            block,
            skip,
            len,
            byte,
        } => {
            let Some(file) = pick(&files, file) else {
                return;
            };
            let offset = block * 4096 + skip;
            let bytes = vec![byte; len];
            assert_eq!(fs.write(file, offset, &bytes).unwrap() as usize, len);
            model.write(file, offset as usize, &bytes);
        }
        Op::Truncate { file, size } => {
            let Some(file) = pick(&files, file) else {
                return;
            };
            let change = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            fs.setattr(file, &change, &who).unwrap();
            model.truncate(file, size as usize);
        }
        Op::Link { file, dir, name } => {
            let (Some(file), Some(dir)) = (pick(&files, file), pick(&dirs, dir)) else {
                return;
            };
            let real = fs.link(file, dir, NAMES[name], &who);
            let expected = match model.entry(dir, NAMES[name]) {
                Some(_) => Outcome::Exists,
                None => Outcome::Ok,
            };
            assert_eq!(Outcome::of(&real), expected, "{op:?}");
            if real.is_ok() {
                fs.forget(file, 1);
                model.link(file, dir, NAMES[name]);
            }
        }
        Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
            let dir = pick(&dirs, dir).unwrap();
            let want_dir = matches!(op, Op::Rmdir { .. });
            let real = match want_dir {
                true => fs.rmdir(dir, NAMES[name], &who),
                false => fs.unlink(dir, NAMES[name], &who),
            };
            assert_eq!(
                Outcome::of(&real),
                model.unlink(dir, NAMES[name], want_dir),
                "{op:?}"
            );
        }
        Op::Rename { from, to, mode } => {
            let mode = [
                RenameMode::Replace,
                RenameMode::NoReplace,
                RenameMode::Exchange,
            ][usize::from(mode)];
            let from = (pick(&dirs, from.0).unwrap(), NAMES[from.1]);
            let to = (pick(&dirs, to.0).unwrap(), NAMES[to.1]);
            let real = fs.rename(from.0, from.1, to.0, to.1, mode, &who);
            assert_eq!(Outcome::of(&real), model.rename(from, to, mode), "{op:?}");
        }
        Op::Fsync { file } => {
            if let Some(file) = pick(&files, file) {
                fs.fsync(file, false).unwrap();
            }
        }
        Op::Fallocate { .. } | Op::SetXattr { .. } | Op::RemoveXattr { .. } | Op::Read { .. } => {
            step_more(fs, model, op)
        }
        Op::Remount => unreachable!("handled by the runner"),
    }
}

/// The fallocate and extended attribute operations.
fn step_more(fs: &Filesystem, model: &mut Model, op: &Op) {
    let all: Vec<u64> = model.nodes.keys().copied().collect();
    match *op {
        Op::Fallocate {
            file,
            offset,
            len,
            mode,
        } => {
            let Some(file) = pick(&model.files(), file) else {
                return;
            };
            let mode = [
                FallocateMode::Allocate { keep_size: false },
                FallocateMode::Allocate { keep_size: true },
                FallocateMode::PunchHole,
                FallocateMode::ZeroRange { keep_size: false },
                FallocateMode::ZeroRange { keep_size: true },
                FallocateMode::CollapseRange,
                FallocateMode::InsertRange,
            ][usize::from(mode)];
            let (offset, len) = match mode {
                FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                    (offset / 4096 * 4096, len.div_ceil(4096) * 4096)
                }
                _ => (offset, len),
            };
            let size = fs.getattr(file).unwrap().size;
            let fits = match mode {
                FallocateMode::CollapseRange => offset + len < size,
                FallocateMode::InsertRange => offset < size,
                _ => true,
            };
            match fs.fallocate(file, offset, len, mode) {
                Ok(()) if fits => model.fallocate(file, offset as usize, len as usize, mode),
                Err(FsError::InvalidArgument(_)) if !fits => {}
                other => panic!("{mode:?} {offset}+{len} of {size}: {other:?}"),
            }
        }
        Op::SetXattr {
            inode,
            name,
            length,
            byte,
        } => {
            let inode = pick(&all, inode).unwrap();
            let value = vec![byte; XATTR_LENGTHS[length]];
            fs.setxattr(inode, XATTR_NAMES[name], &value, XattrFlags::Any, &root())
                .unwrap();
            model.setxattr(inode, XATTR_NAMES[name], &value);
        }
        Op::RemoveXattr { inode, name } => {
            let inode = pick(&all, inode).unwrap();
            let real = fs.removexattr(inode, XATTR_NAMES[name], &root());
            let expected = model.removexattr(inode, XATTR_NAMES[name]);
            assert_eq!(Outcome::of(&real), expected, "{op:?}");
        }
        Op::Read { file, offset, len } => {
            let Some(file) = pick(&model.files(), file) else {
                return;
            };
            let Some(Node::File { data, .. }) = model.nodes.get(&file) else {
                return;
            };
            let from = (offset as usize).min(data.len());
            let to = (from + len as usize).min(data.len());
            let real = fs.read_data(file, offset, len).unwrap();
            assert!(real[..] == data[from..to], "{op:?}");
        }
        _ => unreachable!("handled by step"),
    }
}

/// Compares the extended attributes of `inode` with the model.
fn compare_xattrs(fs: &Filesystem, model: &Model, inode: u64) {
    let mut names = fs.listxattr(inode, &root()).unwrap();
    names.sort();
    let wanted = model.xattrs.get(&inode).cloned().unwrap_or_default();
    let wanted_names: Vec<Vec<u8>> = wanted.keys().cloned().collect();
    assert_eq!(names, wanted_names, "xattr names of {inode}");
    for (name, value) in &wanted {
        let real = fs.getxattr(inode, name, &root()).unwrap();
        assert!(real == *value, "xattr value of {inode}");
    }
}

/// Compares the whole tree under `dir` with the model.
fn compare(fs: &Filesystem, model: &Model, dir: u64) {
    let Some(Node::Dir { entries, parent }) = model.nodes.get(&dir) else {
        panic!("model has no directory {dir}");
    };
    let listed = fs.readdir(dir, 0, usize::MAX).unwrap();
    assert_eq!(listed[1].inode, *parent, "'..' of {dir}");
    let real: Vec<(Vec<u8>, u64)> = {
        let mut out: Vec<_> = listed[2..]
            .iter()
            .map(|e| (e.name.clone(), e.inode))
            .collect();
        out.sort();
        out
    };
    let wanted: Vec<(Vec<u8>, u64)> = entries.iter().map(|(n, i)| (n.clone(), *i)).collect();
    assert_eq!(real, wanted, "entries of {dir}");
    let subdirs = entries.values().filter(|i| model.is_dir(**i)).count() as u32;
    assert_eq!(
        fs.getattr(dir).unwrap().nlink,
        2 + subdirs,
        "nlink of {dir}"
    );
    compare_xattrs(fs, model, dir);
    for inode in entries.values() {
        match model.nodes.get(inode) {
            Some(Node::Dir { .. }) => compare(fs, model, *inode),
            Some(Node::File { data, nlink }) => {
                let attr = fs.getattr(*inode).unwrap();
                assert_eq!(attr.size, data.len() as u64, "size of {inode}");
                assert_eq!(attr.nlink, *nlink, "nlink of {inode}");
                let read = fs.read(*inode, 0, data.len() as u32 + 10).unwrap();
                assert!(read == *data, "contents of {inode}");
                compare_xattrs(fs, model, *inode);
            }
            None => panic!("model entry names no inode"),
        }
    }
}

fn run(ops: &[Op]) {
    run_with(ops, MountOptions::default());
}

fn run_with(ops: &[Op], options: MountOptions) {
    let device: Arc<MemDevice> = make_device(64 << 20);
    let mount = |device: &Arc<MemDevice>| mount_with(device, options.clone());
    let mut fs = mount(&device);
    let mut model = Model::new(fs.root());
    for op in ops {
        match op {
            Op::Remount => {
                fs.unmount().unwrap();
                fsck_clean(&device);
                fs = mount(&device);
            }
            op => step(&fs, &mut model, op),
        }
        compare(&fs, &model, fs.root());
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    // Random operation sequences agree with the model after every step and leave fsck clean.
    #[test]
    fn namespace_and_data_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops);
    }

    // The same with write-behind on, its cap small (32 KiB) so writers also write back.
    #[test]
    fn namespace_and_data_match_the_model_with_write_behind(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run_with(&ops, write_behind(32 << 10));
    }
}

// Found by the model: NoReplace onto an existing name inside the source directory itself
// must report Exists (as Linux does) before the move-into-itself check.
#[test]
fn regression_noreplace_into_itself_reports_exists() {
    run(&[
        Op::Mkdir { dir: 0, name: 0 },
        Op::Create { dir: 1, name: 1 },
        Op::Rename {
            from: (0, 0),
            to: (1, 1),
            mode: 1,
        },
    ]);
}

/// Names of the big-directory model: long, so a directory needs many blocks.
fn big_name(index: u16) -> Vec<u8> {
    let mut name = format!("{index:05}-").into_bytes();
    name.resize(200, b'x');
    name
}

/// The data fork format of inode `number` as stored (the filesystem is unmounted).
fn stored_format(device: &Arc<MemDevice>, number: u64) -> cairn_format::inode::ForkFormat {
    use cairn_blockdev::{AlignedBuf, BlockDevice};
    let mut head = AlignedBuf::zeroed(65536);
    device.read_at(0, &mut head).unwrap();
    let superblock = cairn_format::Superblock::read_primary(&head).unwrap();
    let geometry = superblock.geometry;
    let position = geometry.inode_position(cairn_format::InodeNumber(number));
    let (block, offset) = position.unwrap();
    let block_size = u64::from(geometry.block_size);
    let mut raw = AlignedBuf::zeroed(block_size as usize);
    device.read_at(block.0 * block_size, &mut raw).unwrap();
    let expected = cairn_format::Expected {
        kind: cairn_format::MetaKind::Inode,
        blkno: number,
        uuid: superblock.uuid(),
        owner: Some(number),
    };
    let size = geometry.inode_size as usize;
    let core = cairn_format::inode::InodeCore::read(&raw[offset..offset + size], &expected);
    core.unwrap().data_format
}

/// Checks directory `dir` against `model` (name -> inode): lookups and a full readdir.
fn compare_big(fs: &Filesystem, dir: u64, model: &std::collections::BTreeMap<u16, u64>) {
    for (&index, &inode) in model {
        let found = fs.lookup(dir, &big_name(index)).unwrap();
        assert_eq!(found.inode, inode);
        fs.forget(found.inode, 1);
    }
    let (mut listed, mut cookie) = (std::collections::BTreeMap::new(), 0);
    loop {
        let batch = fs.readdir(dir, cookie, 100).unwrap();
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        for entry in batch.into_iter().filter(|e| e.name.len() == 200) {
            let index: u16 = std::str::from_utf8(&entry.name[..5])
                .unwrap()
                .parse()
                .unwrap();
            assert!(listed.insert(index, entry.inode).is_none(), "listed twice");
        }
    }
    assert_eq!(&listed, model);
}

/// A big directory whose blocks are interleaved with its files' data, so its map outgrows
/// the inline extent list and becomes an extent tree; then random creates and unlinks
/// against a model, remounts, space reuse, and an rmdir that frees every block.
fn run_big_directory(ops: &[(bool, u16)]) {
    const PREFILL: u16 = 700;
    let device: Arc<MemDevice> = make_device(64 << 20);
    let mut fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"big", 0o755, &who).unwrap().inode;
    fs.forget(dir, 1);
    let mut model = std::collections::BTreeMap::new();
    for index in 0..PREFILL {
        let made = fs.create(dir, &big_name(index), FileKind::Regular, 0o644, 0, &who);
        let made = made.unwrap();
        fs.write(made.inode, 0, &[7u8; 100]).unwrap();
        fs.forget(made.inode, 1);
        model.insert(index, made.inode);
    }
    fs.unmount().unwrap();
    assert_eq!(
        stored_format(&device, dir),
        cairn_format::inode::ForkFormat::Btree
    );
    fsck_clean(&device);
    fs = mount(&device);
    compare_big(&fs, dir, &model);
    for (step, &(create, index)) in ops.iter().enumerate() {
        let name = big_name(index);
        if create && !model.contains_key(&index) {
            let made = fs.create(dir, &name, FileKind::Regular, 0o644, 0, &who);
            let made = made.unwrap();
            fs.forget(made.inode, 1);
            model.insert(index, made.inode);
        } else if !create && model.remove(&index).is_some() {
            fs.unlink(dir, &name, &who).unwrap();
        }
        if step % 64 == 63 {
            fs.unmount().unwrap();
            fsck_clean(&device);
            fs = mount(&device);
        }
    }
    compare_big(&fs, dir, &model);
    // Space reuse: as many entries as were removed come back without growing the directory.
    let size = fs.getattr(dir).unwrap().size;
    let gone: Vec<u16> = model.keys().copied().step_by(2).collect();
    for &index in &gone {
        fs.unlink(dir, &big_name(index), &who).unwrap();
        model.remove(&index);
    }
    for &index in &gone {
        let made = fs.create(dir, &big_name(index), FileKind::Regular, 0o644, 0, &who);
        let made = made.unwrap();
        fs.forget(made.inode, 1);
        model.insert(index, made.inode);
    }
    assert_eq!(
        fs.getattr(dir).unwrap().size,
        size,
        "removed space was reused"
    );
    compare_big(&fs, dir, &model);
    for &index in model.keys() {
        fs.unlink(dir, &big_name(index), &who).unwrap();
    }
    let statfs = fs.statfs().unwrap();
    let blocks = fs.getattr(dir).unwrap().blocks_512 * 512 / u64::from(statfs.block_size);
    fs.rmdir(fs.root(), b"big", &who).unwrap();
    let freed = fs.statfs().unwrap().blocks_free - statfs.blocks_free;
    assert_eq!(freed, blocks, "rmdir frees every directory block");
    fs.unmount().unwrap();
    fsck_clean(&device);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    // A directory mapped by an extent tree agrees with the model through random creates,
    // unlinks and remounts, reuses removed space, and frees every block on rmdir.
    #[test]
    fn big_directory_matches_the_model(
        ops in proptest::collection::vec((any::<bool>(), 0u16..1000), 1..200)
    ) {
        run_big_directory(&ops);
    }
}
