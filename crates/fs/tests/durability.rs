#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What a crash shows of files nobody `fsync`ed, with write-behind on (the daemon's
//! default): a file comes back shorter than written with its bytes right, or absent, never
//! with bytes nobody wrote; a file replaced by a rename or rewritten after a truncate to
//! zero shows its old content or its new one, whole; and whatever the filesystem received
//! longer ago than the commit window is durable without an `fsync`.
//!
//! Each test crashes by mounting a copy of what the device holds durably
//! (`MemDevice::durable_image`), after an unrelated file's `fsync` forced the log.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blockdev::MemDevice;
use cairn_fs::{FileKind, Filesystem, MountOptions, SetAttr, TimeOrNow};
use common::{fsck_clean, make_device, root};

const CACHE_BYTES: u64 = 64 << 20;

fn cached() -> MountOptions {
    common::write_behind(CACHE_BYTES)
}

fn create(fs: &Filesystem, parent: u64, name: &str) -> u64 {
    fs.create(
        parent,
        name.as_bytes(),
        FileKind::Regular,
        0o644,
        0,
        &root(),
    )
    .unwrap()
    .inode
}

/// What the kernel's writeback cache sends after writing a file: a setattr of its times,
/// which logs the inode (with the size in memory, before the logged size was kept apart).
fn touch(fs: &Filesystem, inode: u64) {
    let times = SetAttr {
        mtime: Some(TimeOrNow::Now),
        ..SetAttr::default()
    };
    fs.setattr(inode, &times, &root()).unwrap();
}

/// Another program's durable file: its fsync forces the log with everything before it.
fn unrelated_fsync(fs: &Filesystem) {
    let other = create(fs, fs.root(), "unrelated");
    fs.write(other, 0, b"other program's data").unwrap();
    fs.fsync(other, false).unwrap();
}

/// A copy of what `device` holds durably, as a crash right now would leave it, mounted.
fn crash(device: &Arc<MemDevice>) -> (Arc<MemDevice>, Filesystem) {
    let image = MemDevice::from_image(device.durable_image(), common::SECTOR).unwrap();
    let image = Arc::new(image);
    let fs = common::mount_with(&image, cached());
    (image, fs)
}

/// The content of `name` in the root after the crash, or `None` if the name is gone.
fn content(fs: &Filesystem, name: &str) -> Option<Vec<u8>> {
    let attr = fs.lookup(fs.root(), name.as_bytes()).ok()?;
    Some(fs.read(attr.inode, 0, attr.size as u32).unwrap())
}

// Case 1 of issue 34: twenty new files written without fsync, each logged again by a
// setattr of its times, then another file's fsync. Before, every file came back at its full
// size holding only NULs; now each is absent, or a prefix of what was written.
#[test]
fn unsynced_new_files_come_back_short_never_zeroed() {
    let device = make_device(64 << 20);
    let fs = common::mount_with(&device, cached());
    let mut written = Vec::new();
    for index in 1..=20 {
        let name = format!("a{index}");
        let inode = create(&fs, fs.root(), &name);
        let text = format!("hello world {index}\n").into_bytes();
        fs.write(inode, 0, &text).unwrap();
        touch(&fs, inode);
        written.push((name, text));
    }
    unrelated_fsync(&fs);
    let (image, crashed) = crash(&device);
    for (name, text) in &written {
        if let Some(found) = content(&crashed, name) {
            assert!(text.starts_with(&found), "{name}: {found:?}");
        }
    }
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.unmount().unwrap();
}

// Case 2 of issue 34: ten files fsynced with old content, then each replaced by a new file
// renamed over it (no fsync), then another file's fsync. Before, all ten held NULs; now
// the rename's transaction follows the new file's data, so each holds exactly its new
// content (or its old one, had the rename not reached the log).
#[test]
fn replace_by_rename_shows_old_or_new_content() {
    let device = make_device(64 << 20);
    let fs = common::mount_with(&device, cached());
    let root_dir = fs.root();
    for index in 1..=10 {
        let inode = create(&fs, root_dir, &format!("c{index}"));
        fs.write(inode, 0, format!("old content {index}\n").as_bytes())
            .unwrap();
        fs.fsync(inode, false).unwrap();
    }
    fs.fsync(root_dir, false).unwrap();
    for index in 1..=10 {
        let temporary = format!("c{index}.tmp");
        let inode = create(&fs, root_dir, &temporary);
        fs.write(inode, 0, format!("new content {index}\n").as_bytes())
            .unwrap();
        touch(&fs, inode);
        let target = format!("c{index}");
        let mode = cairn_fs::RenameMode::Replace;
        fs.rename(
            root_dir,
            temporary.as_bytes(),
            root_dir,
            target.as_bytes(),
            mode,
            &root(),
        )
        .unwrap();
    }
    unrelated_fsync(&fs);
    let (image, crashed) = crash(&device);
    for index in 1..=10 {
        let found = content(&crashed, &format!("c{index}")).expect("a durable name is gone");
        let (old, new) = (
            format!("old content {index}\n"),
            format!("new content {index}\n"),
        );
        // The fsync above forced the renames: the new content, whole.
        assert_eq!(
            String::from_utf8_lossy(&found),
            new,
            "c{index} (old was {old:?})"
        );
    }
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.unmount().unwrap();
}

// The in-place rewrite: open with O_TRUNC, write, close, then another file's fsync. The
// last close writes the new data back before that fsync's checkpoint, which holds the
// truncate: the file shows its new content, not an empty file.
#[test]
fn rewrite_after_truncate_to_zero_is_written_back_at_close() {
    let device = make_device(64 << 20);
    let fs = common::mount_with(&device, cached());
    let inode = create(&fs, fs.root(), "config");
    fs.write(inode, 0, &vec![b'o'; 10_000]).unwrap();
    fs.fsync(inode, false).unwrap();
    let file = fs.open(inode, true, true, false, &root()).unwrap();
    let new = vec![b'n'; 6_000];
    fs.write(inode, 0, &new).unwrap();
    fs.release(file).unwrap();
    unrelated_fsync(&fs);
    let (image, crashed) = crash(&device);
    assert_eq!(content(&crashed, "config").unwrap(), new);
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.unmount().unwrap();
}

// A size logged while cached data lies below it is held back to the first cached byte: a
// truncate that grows the file past cached pages, a chmod, an xattr change each log the
// inode, and a crash after a force shows the file no longer than its written data.
#[test]
fn logged_size_waits_for_cached_data_below_it() {
    let device = make_device(64 << 20);
    let fs = common::mount_with(&device, cached());
    let inode = create(&fs, fs.root(), "grown");
    fs.write(inode, 0, &[7u8; 4096]).unwrap();
    fs.fsync(inode, false).unwrap();
    fs.write(inode, 4096, &[8u8; 5000]).unwrap();
    let grow = SetAttr {
        size: Some(1 << 20),
        ..SetAttr::default()
    };
    fs.setattr(inode, &grow, &root()).unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(inode, &chmod, &root()).unwrap();
    fs.setxattr(inode, b"user.k", b"v", cairn_fs::XattrFlags::Any, &root())
        .unwrap();
    unrelated_fsync(&fs);
    let (image, crashed) = crash(&device);
    let found = content(&crashed, "grown").unwrap();
    assert_eq!(found, vec![7u8; 4096], "the size covered cached bytes");
    crashed.unmount().unwrap();
    fsck_clean(&image);
    // Once written back, the whole size is logged: fsync makes it all durable.
    fs.fsync(inode, false).unwrap();
    let (image, crashed) = crash(&device);
    let found = content(&crashed, "grown").unwrap();
    assert_eq!(found.len(), 1 << 20);
    assert!(found[..4096].iter().all(|&b| b == 7));
    assert!(found[4096..9096].iter().all(|&b| b == 8));
    assert!(found[9096..].iter().all(|&b| b == 0));
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.unmount().unwrap();
}

// The commit window: a background pass as of a window later writes back cached data and
// forces the log, so a new file, a new directory and data written to an old file survive
// a crash with no fsync; a pass as of now (nothing old yet) and a pass on an idle
// filesystem do no I/O.
#[test]
fn commit_window_makes_old_changes_durable() {
    let device = make_device(64 << 20);
    let fs = common::mount_with(&device, cached());
    assert_eq!(fs.commit_window(), Duration::from_secs(5));
    let idle_writes = device.stats().writes;
    fs.background_pass_at(Instant::now() + Duration::from_secs(60));
    assert_eq!(device.stats().writes, idle_writes, "an idle pass wrote");
    let dir = fs.mkdir(fs.root(), b"dir", 0o755, &root()).unwrap().inode;
    let inode = create(&fs, dir, "file");
    fs.write(inode, 0, b"received before the window").unwrap();
    let young_writes = device.stats().writes;
    fs.background_pass();
    assert_eq!(
        device.stats().writes,
        young_writes,
        "a pass wrote young data"
    );
    fs.background_pass_at(Instant::now() + fs.commit_window());
    let (image, crashed) = crash(&device);
    let dir = crashed.lookup(crashed.root(), b"dir").unwrap().inode;
    let file = crashed.lookup(dir, b"file").unwrap();
    let data = crashed.read(file.inode, 0, file.size as u32).unwrap();
    assert_eq!(data, b"received before the window");
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.unmount().unwrap();
}
