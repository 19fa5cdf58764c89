#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{FileKind, FsError, RenameMode};
use common::{fsck_clean, make_device, mount, root};

// Creates files and directories, writes and reads data, remounts, and checks it all survived
// and that fsck finds nothing wrong.
#[test]
fn create_write_remount_persists() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let who = root();
    let top = fs.root();
    let dir = fs.mkdir(top, b"dir", 0o755, &who).unwrap();
    assert_eq!(dir.kind, FileKind::Directory);
    let file = fs
        .create(dir.inode, b"file", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    assert_eq!(fs.write(file.inode, 0, b"hello world").unwrap(), 11);
    assert_eq!(fs.read(file.inode, 0, 100).unwrap(), b"hello world");
    assert_eq!(fs.write(file.inode, 10_000, b"far").unwrap(), 3);
    let read = fs.read(file.inode, 0, 20_000).unwrap();
    assert_eq!(read.len(), 10_003);
    assert!(read[11..10_000].iter().all(|&b| b == 0));
    assert!(matches!(
        fs.create(dir.inode, b"file", FileKind::Regular, 0o644, 0, &who),
        Err(FsError::Exists)
    ));
    fs.unmount().unwrap();
    fsck_clean(&device);

    let fs = mount(&device);
    let dir = fs.lookup(fs.root(), b"dir").unwrap();
    let file = fs.lookup(dir.inode, b"file").unwrap();
    assert_eq!(file.size, 10_003);
    assert_eq!(&fs.read(file.inode, 0, 11).unwrap()[..], b"hello world");
    assert_eq!(fs.read(file.inode, 10_000, 10).unwrap(), b"far");
    let names: Vec<_> = fs
        .readdir(dir.inode, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"file".to_vec()]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Fills a directory past the short form so it moves into blocks, then removes everything.
#[test]
fn directory_grows_into_blocks_and_empties() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"big", 0o755, &who).unwrap();
    let count = 300;
    for index in 0..count {
        let name = format!("entry-number-{index:05}");
        fs.create(
            dir.inode,
            name.as_bytes(),
            FileKind::Regular,
            0o644,
            0,
            &who,
        )
        .unwrap();
    }
    for index in 0..count {
        let name = format!("entry-number-{index:05}");
        fs.lookup(dir.inode, name.as_bytes()).unwrap();
    }
    let mut seen = 0;
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(dir.inode, cookie, 37).unwrap();
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        seen += batch.len();
    }
    assert_eq!(seen, count + 2);
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    let dir = fs.lookup(fs.root(), b"big").unwrap();
    assert!(matches!(
        fs.rmdir(fs.root(), b"big", &who),
        Err(FsError::NotEmpty)
    ));
    for index in 0..count {
        let name = format!("entry-number-{index:05}");
        fs.unlink(dir.inode, name.as_bytes(), &who).unwrap();
    }
    fs.rmdir(fs.root(), b"big", &who).unwrap();
    assert!(matches!(
        fs.lookup(fs.root(), b"big"),
        Err(FsError::NotFound)
    ));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Access times: relatime (the default) updates atime on a read or a listing only when it is
// not after mtime/ctime (or is a day old); strictatime on every access; noatime never.
#[test]
fn access_times_follow_the_mount_option() {
    use cairn_fs::{AtimeMode, MountOptions, SetAttr, TimeOrNow};
    use std::time::{Duration, UNIX_EPOCH};
    let device = common::make_device(64 << 20);
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let older = UNIX_EPOCH + Duration::from_secs(900_000_000);
    for (mode, after_first, after_second) in [
        (AtimeMode::Relatime, true, false),
        (AtimeMode::Strict, true, true),
        (AtimeMode::Noatime, false, false),
    ] {
        let options = MountOptions {
            atime: mode,
            ..MountOptions::default()
        };
        let dyn_device: std::sync::Arc<dyn cairn_blockdev::BlockDevice> = device.clone();
        let fs = cairn_fs::Filesystem::mount(dyn_device, options).unwrap();
        let name = format!("{mode:?}");
        let f = fs
            .create(
                fs.root(),
                name.as_bytes(),
                cairn_fs::FileKind::Regular,
                0o644,
                0,
                &common::root(),
            )
            .unwrap()
            .inode;
        fs.write(f, 0, b"data").unwrap();
        let times = |atime| cairn_fs::SetAttr {
            atime: Some(TimeOrNow::Time(atime)),
            mtime: Some(TimeOrNow::Time(old)),
            ..SetAttr::default()
        };
        // atime before mtime: relatime updates it.
        fs.setattr(f, &times(older), &common::root()).unwrap();
        // Past the clock's tick (inode times come from the coarse clock, as the kernel's):
        // an atime stamped in the setattr's tick would equal its ctime, which relatime
        // updates again (so does Linux).
        std::thread::sleep(Duration::from_millis(20));
        fs.read(f, 0, 4).unwrap();
        let first = fs.getattr(f).unwrap().atime;
        assert_eq!(first != older, after_first, "{mode:?} first read");
        // atime now after mtime (and less than a day old): only strictatime updates it.
        std::thread::sleep(Duration::from_millis(5));
        fs.read(f, 0, 4).unwrap();
        let second = fs.getattr(f).unwrap().atime;
        assert_eq!(second != first, after_second, "{mode:?} second read");
        let dir = fs.root();
        fs.setattr(dir, &times(older), &common::root()).unwrap();
        fs.readdir(dir, 0, 100).unwrap();
        let listed = fs.getattr(dir).unwrap().atime;
        assert_eq!(listed != older, after_first, "{mode:?} listing");
        fs.unmount().unwrap();
    }
    common::fsck_clean(&device);
}

// The kernel sends a ctime SETATTR after every unlink of a file it caches with the writeback
// cache. On an unlinked inode times change in memory only (a crash frees the inode): no
// commit; any other change still commits, and the inode is freed cleanly after.
#[test]
fn times_of_an_unlinked_inode_are_not_logged() {
    use cairn_fs::{SetAttr, TimeOrNow};
    use std::time::{Duration, SystemTime};
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let file = fs
        .create(top, b"f", FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode;
    let open = fs.open(file, true, false, false, &root()).unwrap();
    fs.unlink(top, b"f", &root()).unwrap();
    let commits = |fs: &cairn_fs::Filesystem| fs.stats().journal.commits;
    let before = commits(&fs);
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let times = SetAttr {
        mtime: Some(TimeOrNow::Time(when)),
        ctime: Some(when),
        ..SetAttr::default()
    };
    let attr = fs.setattr(file, &times, &root()).unwrap();
    assert_eq!(attr.mtime, when);
    assert_eq!(fs.getattr(file).unwrap().mtime, when);
    assert_eq!(
        commits(&fs),
        before,
        "a time change of an unlinked inode committed"
    );
    let mode = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(file, &mode, &root()).unwrap();
    assert_eq!(commits(&fs), before + 1);
    fs.release(open).unwrap();
    fs.forget(file, 1);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A file the kernel still holds a lookup reference on, but nobody has open, gives its blocks
// back when its last name goes, by unlink or by a rename over it (a `df` right after `rm` or
// `mv` may be served before the kernel's FORGET); a file removed while open keeps them until
// its last close; the inodes go at the FORGET.
#[test]
fn unlink_frees_the_data_of_a_file_nobody_has_open() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let who = root();
    let empty = fs.statfs().unwrap().blocks_free;
    let make = |name: &[u8], bytes: usize| {
        let inode = fs
            .create(fs.root(), name, FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode;
        fs.write(inode, 0, &vec![7u8; bytes]).unwrap();
        fs.fsync(inode, false).unwrap();
        inode
    };
    let files = [&b"closed"[..], b"opened", b"renamed"].map(|name| make(name, 4 << 20));
    let file = fs.open(files[1], false, false, false, &who).unwrap();
    let free = || fs.statfs().unwrap().blocks_free;
    let with_all = free();
    fs.unlink(fs.root(), b"closed", &who).unwrap();
    let after_unlink = free();
    assert!(
        after_unlink >= with_all + 1024,
        "{with_all} -> {after_unlink}"
    );
    let small = make(b"small", 4096);
    let with_small = free();
    fs.rename(
        fs.root(),
        b"small",
        fs.root(),
        b"renamed",
        RenameMode::Replace,
        &who,
    )
    .unwrap();
    assert!(free() >= with_small + 1024, "{with_small} -> {}", free());
    let after_rename = free();
    fs.unlink(fs.root(), b"opened", &who).unwrap();
    assert_eq!(free(), after_rename);
    assert_eq!(fs.read(files[1], 0, 4096).unwrap(), vec![7u8; 4096]);
    fs.release(file).unwrap();
    assert!(
        free() >= after_rename + 1024,
        "{after_rename} -> {}",
        free()
    );
    fs.unlink(fs.root(), b"renamed", &who).unwrap();
    assert_eq!(free(), empty);
    for inode in files.into_iter().chain([small]) {
        fs.forget(inode, 1);
    }
    assert_eq!(free(), empty);
    fs.unmount().unwrap();
    fsck_clean(&device);
}
