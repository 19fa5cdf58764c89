//! Thousands of attributes on one inode (the index form): a model proptest of sets,
//! replaces, removes, gets, lists and remounts on small blocks (many leaves, a multi-level
//! index); names that all share one hash; 10,000 attributes with values up to 64 KiB; and an
//! unlink that gives every block back. fsck after each.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{FileKind, Filesystem, FsError, XattrFlags};
use common::{fsck_clean, make_device, make_small_block_device, mount, root};
use proptest::prelude::*;

fn file(fs: &Filesystem, name: &[u8]) -> u64 {
    fs.create(fs.root(), name, FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

fn set(fs: &Filesystem, inode: u64, name: &[u8], value: &[u8]) {
    fs.setxattr(inode, name, value, XattrFlags::Any, &root())
        .unwrap_or_else(|e| panic!("set {}: {e}", String::from_utf8_lossy(name)));
}

/// Checks every attribute of `inode` against `model`, values and list.
fn check(fs: &Filesystem, inode: u64, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (name, value) in model {
        let got = fs.getxattr(inode, name, &root());
        assert!(
            got.as_ref().ok() == Some(value),
            "{}: {got:?}",
            String::from_utf8_lossy(name)
        );
    }
    let mut listed = fs.listxattr(inode, &root()).unwrap();
    listed.sort();
    let names: Vec<Vec<u8>> = model.keys().cloned().collect();
    assert_eq!(listed, names);
}

#[derive(Debug, Clone)]
enum Op {
    Set { id: u16, len: usize, seed: u64 },
    Remove { id: u16 },
    Get { id: u16 },
    Remount,
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![8 => 0usize..40, 2 => 40usize..600, 1 => 600usize..5000];
    prop_oneof![
        12 => (0u16..400, len, any::<u64>()).prop_map(|(id, len, seed)| Op::Set { id, len, seed }),
        4 => (0u16..400).prop_map(|id| Op::Remove { id }),
        2 => (0u16..400).prop_map(|id| Op::Get { id }),
        1 => Just(Op::Remount),
    ]
}

fn name(id: u16) -> Vec<u8> {
    format!("user.attribute-{id:05}").into_bytes()
}

fn run_ops(device: &Arc<MemDevice>, ops: &[Op]) {
    let mut fs = mount(device);
    let f = file(&fs, b"f");
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Set { id, len, seed } => {
                let v = value(seed, len);
                set(&fs, f, &name(id), &v);
                model.insert(name(id), v);
            }
            Op::Remove { id } => {
                let removed = fs.removexattr(f, &name(id), &root());
                match model.remove(&name(id)) {
                    Some(_) => removed.unwrap(),
                    None => assert!(matches!(removed, Err(FsError::NoData)), "{removed:?}"),
                }
            }
            Op::Get { id } => {
                let got = fs.getxattr(f, &name(id), &root()).ok();
                assert_eq!(got.as_ref(), model.get(&name(id)));
            }
            Op::Remount => {
                fs.unmount().unwrap();
                fsck_clean(device);
                fs = mount(device);
            }
        }
    }
    check(&fs, f, &model);
    fs.unmount().unwrap();
    fsck_clean(device);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    // Random sets (values up to 5,000 bytes: local and remote), removes and gets of up to
    // 400 names on 1 KiB blocks, with remounts, against a map.
    #[test]
    fn many_attributes_match_a_model(ops in proptest::collection::vec(op(), 300..900)) {
        let device = make_small_block_device(32 << 20, 1024, 2);
        run_ops(&device, &ops);
    }
}

/// Names `user.collide-<i>-` plus 4 bytes whose stored part (after "user.") all have the
/// CRC32C (`name_hash`) `target`:
/// CRC32C is affine in the last 4 bytes, so they are solved for (Gaussian elimination).
fn colliding_names(count: usize, target: u32) -> Vec<Vec<u8>> {
    let crc = |bytes: &[u8]| cairn_format::dir::name_hash(bytes);
    let mut out = Vec::new();
    let mut index = 0u32;
    while out.len() < count {
        // The hash covers the stored name: the part after "user.".
        let mut base = format!("collide-{index}-").into_bytes();
        index += 1;
        let zero = crc(&[&base[..], &[0; 4]].concat());
        // Column i: the CRC change that flipping suffix bit i makes.
        let columns: Vec<u32> = (0..32)
            .map(|bit| {
                let suffix = (1u32 << bit).to_le_bytes();
                crc(&[&base[..], &suffix].concat()) ^ zero
            })
            .collect();
        let Some(suffix) = solve(&columns, target ^ zero) else {
            continue;
        };
        let suffix = suffix.to_le_bytes();
        if suffix.contains(&0) {
            continue;
        }
        base.extend_from_slice(&suffix);
        assert_eq!(crc(&base), target);
        out.push([&b"user."[..], &base].concat());
    }
    out
}

/// The x with `XOR of columns[i] over the set bits i of x == want`, if any (GF(2)).
fn solve(columns: &[u32], want: u32) -> Option<u32> {
    // basis[b]: a reachable value whose highest bit is b, with the columns that make it.
    let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
    for (index, &column) in columns.iter().enumerate() {
        let (mut value, mut combo) = (column, 1u32 << index);
        while value != 0 {
            let bit = 31 - value.leading_zeros() as usize;
            match basis[bit] {
                Some((v, c)) => (value, combo) = (value ^ v, combo ^ c),
                None => {
                    basis[bit] = Some((value, combo));
                    break;
                }
            }
        }
    }
    let (mut value, mut combo) = (want, 0u32);
    while value != 0 {
        let (v, c) = basis[31 - value.leading_zeros() as usize]?;
        (value, combo) = (value ^ v, combo ^ c);
    }
    Some(combo)
}

// 300 names with one hash (several leaves' worth): each is found, replaced and removed by
// name; the index stays valid for fsck throughout.
#[test]
fn names_sharing_a_hash() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let f = file(&fs, b"f");
    let names = colliding_names(300, 0x1234_5678);
    let mut model = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let v = value(i as u64, 20 + i % 40);
        set(&fs, f, n, &v);
        model.insert(n.clone(), v);
    }
    check(&fs, f, &model);
    for (i, n) in names.iter().enumerate().step_by(3) {
        let v = value(i as u64 + 1000, 300);
        set(&fs, f, n, &v);
        model.insert(n.clone(), v);
    }
    for n in names.iter().skip(1).step_by(2) {
        fs.removexattr(f, n, &root()).unwrap();
        model.remove(n);
    }
    check(&fs, f, &model);
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    check(&fs, f, &model);
    fs.unmount().unwrap();
}

// 10,000 attributes, some with 64 KiB values, on one file: all there after a remount; then
// the file is removed and every block comes back.
#[test]
fn ten_thousand_attributes_and_an_unlink() {
    let device = make_device(256 << 20);
    let fs = mount(&device);
    let free_before = fs.statfs().unwrap().blocks_free;
    let f = file(&fs, b"f");
    let mut model = BTreeMap::new();
    for i in 0..10_000u64 {
        let len = match i % 1000 {
            0 => 65_536,
            1..=9 => 1500,
            _ => (i % 50) as usize,
        };
        let n = format!("user.{i:08}").into_bytes();
        let v = value(i, len);
        set(&fs, f, &n, &v);
        model.insert(n, v);
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    check(&fs, f, &model);
    fs.forget(f, 1);
    fs.unlink(fs.root(), b"f", &root()).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before);
    fs.unmount().unwrap();
    fsck_clean(&device);
}
