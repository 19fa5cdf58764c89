#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Removing things from a full filesystem always works: a filesystem filled to the last block
//! by many kinds of metadata and data (sparse files whose extent maps need trees, directories
//! with many entries, extended attributes, long symlinks) gives every removal the blocks its
//! metadata needs, and fsck is clean afterwards.

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{FallocateMode, FileKind, Filesystem, FsError, RenameMode, XattrFlags};
use common::{fsck_clean, root};
use proptest::prelude::*;

const BLOCK: u32 = 1024;

/// A small filesystem of 1 KiB blocks in two AGs.
fn small_device() -> Arc<MemDevice> {
    common::make_small_block_device(8 << 20, BLOCK, 2)
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

/// What the fill made, to remove again.
#[derive(Default)]
struct Made {
    dirs: Vec<(u64, Vec<u8>, u64)>,
    names: Vec<(u64, Vec<u8>)>,
    /// Regular files (user attributes are not allowed on symlinks).
    files: Vec<u64>,
    xattrs: Vec<(u64, Vec<u8>)>,
}

fn fill_step(
    fs: &Filesystem,
    rng: &mut Rng,
    made: &mut Made,
    serial: usize,
) -> Result<(), FsError> {
    let who = root();
    let parents: Vec<u64> = std::iter::once(fs.root())
        .chain(made.dirs.iter().map(|d| d.2))
        .collect();
    let parent = parents[rng.below(parents.len() as u64) as usize];
    let name = format!("n{serial:05}").into_bytes();
    match rng.below(10) {
        0 if made.dirs.len() < 6 => {
            let inode = fs.mkdir(parent, &name, 0o755, &who)?.inode;
            made.dirs.push((parent, name, inode));
        }
        0..=3 => {
            let inode = fs
                .create(parent, &name, FileKind::Regular, 0o644, 0, &who)?
                .inode;
            made.names.push((parent, name));
            made.files.push(inode);
            // Runs of 1-4 blocks with a hole after each: many extents, so the map needs a
            // tree, and punching inside a run splits an extent.
            let run = 1 + rng.below(4);
            let bytes = vec![0x5a; (run * u64::from(BLOCK)) as usize];
            for index in 0..rng.below(24) {
                fs.write(inode, index * (run + 1) * u64::from(BLOCK), &bytes)?;
            }
        }
        4..=5 => {
            let target = vec![b't'; 1 + rng.below(1000) as usize];
            let inode = fs.symlink(parent, &name, &target, &who)?.inode;
            made.names.push((parent, name));
            fs.forget(inode, 1);
        }
        6..=7 if !made.files.is_empty() => {
            let inode = made.files[rng.below(made.files.len() as u64) as usize];
            let xname = format!("user.x{serial}").into_bytes();
            let value = vec![0xa5; rng.below(1500) as usize];
            fs.setxattr(inode, &xname, &value, XattrFlags::Create, &who)?;
            made.xattrs.push((inode, xname));
        }
        8 if !made.names.is_empty() => rename_step(fs, rng, made, parent, name)?,
        9 if !made.names.is_empty() => {
            let (dir, old) = &made.names[rng.below(made.names.len() as u64) as usize];
            let inode = fs.lookup(*dir, old)?.inode;
            let linked = fs.link(inode, parent, &name, &who);
            fs.forget(inode, if linked.is_ok() { 2 } else { 1 });
            linked?;
            made.names.push((parent, name));
        }
        _ => {
            let inode = fs
                .create(parent, &name, FileKind::Regular, 0o644, 0, &who)?
                .inode;
            made.names.push((parent, name));
            fs.forget(inode, 1);
        }
    }
    Ok(())
}

/// Renames a random name to `name` in `parent`, or over another random name (replacing it).
fn rename_step(
    fs: &Filesystem,
    rng: &mut Rng,
    made: &mut Made,
    parent: u64,
    name: Vec<u8>,
) -> Result<(), FsError> {
    let from = rng.below(made.names.len() as u64) as usize;
    let over = rng.below(made.names.len() as u64) as usize;
    let replace = rng.below(2) == 0 && over != from;
    let to = match replace {
        true => made.names[over].clone(),
        false => (parent, name),
    };
    let (dir, old) = &made.names[from];
    let inode_of = |(dir, name): &(u64, Vec<u8>)| {
        let inode = fs.lookup(*dir, name).map(|attr| attr.inode);
        inode.inspect(|&inode| fs.forget(inode, 1))
    };
    if replace && inode_of(&made.names[from])? == inode_of(&to)? {
        return Ok(()); // Two links of one file: rename does nothing.
    }
    fs.rename(*dir, old, to.0, &to.1, RenameMode::Replace, &root())?;
    made.names[from] = to;
    if replace {
        made.names.swap_remove(over);
    }
    Ok(())
}

/// Fills until 200 steps have found no space (renames and links go on succeeding, so the
/// failures are counted, not required in a row).
fn fill(fs: &Filesystem, rng: &mut Rng) -> Made {
    let mut made = Made::default();
    let mut failures = 0;
    for serial in 0.. {
        match fill_step(fs, rng, &mut made, serial) {
            Ok(()) => {}
            Err(FsError::NoSpace) => failures += 1,
            Err(error) => panic!("fill step {serial}: {error}"),
        }
        if failures >= 200 {
            break;
        }
        assert!(serial < 1 << 20, "the filesystem never filled");
    }
    made
}

/// Punches 40 random holes into the files of a full filesystem: each succeeds or fails with
/// `NoSpace` (splitting an extent can need an extent-tree block).
fn punch_holes(fs: &Filesystem, rng: &mut Rng, made: &Made) {
    let block = u64::from(BLOCK);
    for _ in 0..40 {
        let inode = made.files[rng.below(made.files.len() as u64) as usize];
        let offset = rng.below(48) * block / 2;
        let len = (1 + rng.below(6)) * block / 2;
        match fs.fallocate(inode, offset, len, FallocateMode::PunchHole) {
            Ok(()) | Err(FsError::NoSpace) => {}
            Err(error) => panic!("punch {inode} {offset}+{len}: {error}"),
        }
    }
}

/// Removes everything `made` lists, after a remount (no lookup references left).
fn remove_all(fs: &Filesystem, rng: &mut Rng, mut made: Made) {
    let who = root();
    while !made.xattrs.is_empty() {
        let (inode, name) = made
            .xattrs
            .swap_remove(rng.below(made.xattrs.len() as u64) as usize);
        fs.removexattr(inode, &name, &who)
            .unwrap_or_else(|e| panic!("removexattr {inode}: {e}"));
    }
    while !made.names.is_empty() {
        let (dir, name) = made
            .names
            .swap_remove(rng.below(made.names.len() as u64) as usize);
        fs.unlink(dir, &name, &who)
            .unwrap_or_else(|e| panic!("unlink {}: {e}", String::from_utf8_lossy(&name)));
    }
    for (parent, name, _) in made.dirs.into_iter().rev() {
        fs.rmdir(parent, &name, &who)
            .unwrap_or_else(|e| panic!("rmdir {}: {e}", String::from_utf8_lossy(&name)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Fills with random kinds of content, renames and links until 200 steps found no space,
    // checks that every name made is there and fsck is clean, punches holes and recovers
    // from a crash, then removes every xattr, name and directory in random order: none
    // fails, and fsck is clean. The failed steps used to leak blocks (a symlink's target
    // blocks, a data extent whose map could not grow its tree) and to lose a directory's
    // names (an index leaf split half done).
    #[test]
    fn removal_from_a_full_filesystem_succeeds(seed in 1u64..u64::MAX) {
        let device = small_device();
        let fs = common::mount(&device);
        let mut rng = Rng(seed);
        let mut made = fill(&fs, &mut rng);
        let mut linked = std::collections::HashSet::new();
        for (dir, name) in &made.names {
            let found = fs.lookup(*dir, name);
            prop_assert!(found.is_ok(), "{} lost", String::from_utf8_lossy(name));
            let inode = found.unwrap().inode;
            linked.insert(inode);
            fs.forget(inode, 1);
        }
        // Files whose every name a rename replaced are gone after the remount.
        made.files.retain(|inode| linked.contains(inode));
        made.xattrs.retain(|(inode, _)| linked.contains(inode));
        fs.unmount().unwrap();
        fsck_clean(&device);
        let fs = common::mount(&device);
        punch_holes(&fs, &mut rng, &made);
        fs.sync().unwrap();
        let crashed = Arc::new(MemDevice::from_image(device.durable_image(), BLOCK).unwrap());
        drop(fs);
        let fs = common::mount(&crashed);
        fs.unmount().unwrap();
        fsck_clean(&crashed);
        let fs = common::mount(&crashed);
        remove_all(&fs, &mut rng, made);
        fs.unmount().unwrap();
        fsck_clean(&crashed);
    }
}

// A file of 3-block extents with a hole after each fills part of the filesystem, small
// files the rest; punching the middle block of each extent splits it (one more extent-map
// record), and small files take the freed block again, until an extent-tree split finds no
// block. That punch fails with NoSpace and changes nothing: after a crash and recovery every
// block reads what it should (punched ones zeros) and fsck is clean. A failed punch used to
// commit its free intent anyway, and recovery freed a block the file still mapped.
#[test]
fn punch_on_a_full_filesystem_fails_whole() {
    let device = small_device();
    let fs = common::mount(&device);
    let (top, who) = (fs.root(), root());
    let file = fs.create(top, b"f", FileKind::Regular, 0o644, 0, &who);
    let file = file.unwrap().inode;
    // Empty files made first (their inode chunks too): later each takes 64 blocks, or one.
    let fillers: Vec<u64> = (0..1500)
        .map(|index| {
            let name = format!("filler{index}");
            let made = fs.create(top, name.as_bytes(), FileKind::Regular, 0o644, 0, &who);
            made.unwrap().inode
        })
        .collect();
    let mut fillers = fillers.into_iter();
    let block = u64::from(BLOCK);
    let extents = 300;
    for index in 0..extents {
        fs.write(file, index * 4 * block, &[0x5a; 3 * BLOCK as usize])
            .unwrap();
    }
    let mut fill_up = || {
        for filler in fillers.by_ref() {
            let big = fs.write(filler, 0, &[1; 64 * BLOCK as usize]);
            if big.is_err() && fs.write(filler, 0, &[1; BLOCK as usize]).is_err() {
                return;
            }
        }
        panic!("too few fillers");
    };
    fill_up();
    let mut punched = 0;
    let error = loop {
        assert!(punched < extents, "every punch found room");
        let middle = (punched * 4 + 1) * block;
        match fs.fallocate(file, middle, block, FallocateMode::PunchHole) {
            Ok(()) => punched += 1,
            Err(error) => break error,
        }
        fill_up();
    };
    assert!(matches!(error, FsError::NoSpace), "{error}");
    fs.sync().unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), BLOCK).unwrap());
    drop(fs);
    let fs = common::mount(&crashed);
    for index in 0..extents {
        let run = fs.read(file, index * 4 * block, 3 * BLOCK).unwrap();
        let middle = if index < punched { 0 } else { 0x5a };
        let want = [
            [0x5a; BLOCK as usize],
            [middle; BLOCK as usize],
            [0x5a; BLOCK as usize],
        ];
        assert!(run == want.concat(), "extent {index} of {punched} punched");
    }
    fs.unmount().unwrap();
    fsck_clean(&crashed);
}

// Three threads fill one filesystem with the same mix of operations until each has met 200
// NoSpace failures; none may hang (a watchdog) and every name any of them made is there
// with fsck clean. Two creates used to deadlock: one held its inode's AGI in AG 1 and
// wanted AG 0's AGF for a directory block; another held AG 0's AGF from a failed chunk
// allocation and wanted AG 1's AGI.
#[test]
fn concurrent_fill_keeps_every_name() {
    for seed in 1..=120u64 {
        let device = small_device();
        let fs = std::sync::Arc::new(common::mount(&device));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let fs = std::sync::Arc::clone(&fs);
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(seed * 7919 + t + 1);
                    let mut made = Made::default();
                    let mut failures = 0;
                    for serial in 0.. {
                        match fill_step(
                            &fs,
                            &mut rng,
                            &mut made,
                            (t as usize + 1) * 100_000 + serial,
                        ) {
                            Ok(()) => {}
                            Err(FsError::NoSpace) => failures += 1,
                            Err(error) => panic!("seed {seed} thread {t} step {serial}: {error}"),
                        }
                        if failures >= 200 {
                            break;
                        }
                    }
                    done_tx.send(()).unwrap();
                    made
                })
            })
            .collect();
        for _ in 0..3 {
            let finished = done_rx.recv_timeout(std::time::Duration::from_secs(120));
            assert!(
                finished.is_ok(),
                "seed {seed}: a filling thread hung or panicked"
            );
        }
        let mades: Vec<Made> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let fs = std::sync::Arc::try_unwrap(fs).ok().unwrap();
        for made in &mades {
            for (dir, name) in &made.names {
                let found = fs.lookup(*dir, name);
                assert!(
                    found.is_ok(),
                    "seed {seed}: {} lost",
                    String::from_utf8_lossy(name)
                );
            }
        }
        fs.unmount().unwrap();
        fsck_clean(&device);
    }
}
