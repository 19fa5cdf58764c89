//! `umount` returns only once everything is on disk: after each unmount (umount(8),
//! `fusermount3 -u`, or `mount -t fuse.cairn` then umount(8)), with no wait for the daemon,
//! `fsck.cairn -n` is clean, a copy of the image mounts and holds the same tree, and the
//! image can be mounted again at once (the device was released).
//!
//! `cargo test` runs a few rounds of each route; `CAIRN_UNMOUNT_ROUNDS=100 cargo test -p
//! cairn-fuse --test unmount` runs the long loop (docs/testing.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{Mount, Scratch, checksums, fsck, is_mounted, output_text, run, sh};

/// Rounds per route unless `CAIRN_UNMOUNT_ROUNDS` says otherwise.
const ROUNDS_DEFAULT: usize = 3;

fn rounds() -> usize {
    std::env::var("CAIRN_UNMOUNT_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT)
}

/// How a round unmounts.
#[derive(Debug, Clone, Copy)]
enum Route {
    Umount,
    Fusermount,
}

/// Writes of round `round`: a new directory of files (one large), an append to a file
/// every round touches, a rename, a symlink, and the removal of an older round's files.
fn write_round(root: &Path, round: usize) {
    let dir = root.join(format!("round{round}"));
    fs::create_dir(&dir).unwrap();
    for file in 0..8 {
        let len = 1000 * file + 37 * round;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + round + file) as u8).collect();
        fs::write(dir.join(format!("f{file}")), data).unwrap();
    }
    let large: Vec<u8> = (0..(3 << 20) + round)
        .map(|i| (i / 4099 + round) as u8)
        .collect();
    fs::write(dir.join("large"), large).unwrap();
    fs::rename(dir.join("f1"), dir.join("renamed")).unwrap();
    std::os::unix::fs::symlink("renamed", dir.join("link")).unwrap();
    let mut log = fs::read(root.join("log")).unwrap_or_default();
    log.extend_from_slice(format!("round {round}\n").as_bytes());
    fs::write(root.join("log"), log).unwrap();
    if round >= 2 {
        fs::remove_dir_all(root.join(format!("round{}", round - 2))).unwrap();
    }
}

/// Names, types, modes, sizes and link targets under `dir`, then every file's checksum.
fn tree(dir: &Path) -> String {
    let listing = sh(&format!(
        "cd '{}' && find . -printf '%p %y %m %s %l\\n' | sort",
        dir.display()
    ));
    listing + &checksums(dir)
}

fn unmount(mountpoint: &Path, route: Route) {
    let path = mountpoint.to_str().unwrap();
    let output = match route {
        Route::Umount => run("umount", &[path]),
        Route::Fusermount => run("fusermount3", &["-u", path]),
    };
    assert!(
        output.status.success(),
        "{route:?}: {}",
        output_text(&output)
    );
    assert!(!is_mounted(mountpoint));
}

/// What every route must leave right after the unmount returned: a clean check, and a
/// copy of the image whose tree equals `expected`.
fn check_image(scratch: &Scratch, image: &Path, expected: &str, round: usize) {
    assert_eq!(
        fsck(image),
        0,
        "round {round}: fsck right after the unmount"
    );
    let copy = scratch.dir.path().join("copy.img");
    fs::copy(image, &copy).unwrap();
    let copy_mnt = scratch.dir.path().join("copy-mnt");
    fs::create_dir_all(&copy_mnt).unwrap();
    let mount = Mount::new(&copy, &copy_mnt, "ro");
    assert_eq!(tree(&copy_mnt), expected, "round {round}: the copy differs");
    mount.unmount();
    fs::remove_file(&copy).unwrap();
}

/// Mounts, writes, unmounts by `route` and checks, `rounds()` times.
fn rounds_through(route: Route) {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    for round in 0..rounds() {
        let mount = Mount::new(&image, &mnt, "");
        write_round(&mnt, round);
        let expected = tree(&mnt);
        unmount(&mnt, route);
        // The daemon may still be exiting; the image must not need it any more.
        std::mem::forget(mount);
        check_image(&scratch, &image, &expected, round);
    }
}

// umount(8) returns after the write-back: fsck, a copy and a new mount see it all.
#[test]
fn umount_waits_for_the_write_back() {
    rounds_through(Route::Umount);
}

// The same through `fusermount3 -u`.
#[test]
fn fusermount_waits_for_the_write_back() {
    if !common::have("fusermount3") {
        eprintln!("skipped: fusermount3 (package fuse3) is not installed");
        return;
    }
    rounds_through(Route::Fusermount);
}

// `mount -t fuse.NAME` (mount.fuse3 running the daemon) then umount(8): the same checks.
#[test]
fn mount_helper_then_umount_waits() {
    if !common::have("mount.fuse3") {
        eprintln!("skipped: mount.fuse3 (package fuse3) is not installed");
        return;
    }
    let helper = common::HelperName::new();
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let kind = format!("fuse.{}", helper.name);
    for round in 0..rounds() {
        let options = common::transport_options("defaults");
        let output = common::with_ring_enabled(|| {
            Command::new("mount")
                .args(["-t", &kind, "-o", &options])
                .args([image.to_str().unwrap(), mnt.to_str().unwrap()])
                .output()
                .unwrap()
        });
        assert!(
            output.status.success(),
            "mount -t: {}",
            output_text(&output)
        );
        let mount = Mount::adopt(&image, &mnt);
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let line = mounts.lines().find(|l| l.contains(mnt.to_str().unwrap()));
        assert!(
            line.is_some_and(|l| l.contains(" fuseblk.cairn ")),
            "{mounts}"
        );
        write_round(&mnt, round);
        let expected = tree(&mnt);
        unmount(&mnt, Route::Umount);
        std::mem::forget(mount);
        check_image(&scratch, &image, &expected, round);
    }
}

/// Blocks the image file takes on its host filesystem, in KiB.
fn du_kib(image: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(image).unwrap().blocks() / 2
}

// `cairn trim` punches the deleted files' space out of the image, and `-o discard` does it
// by itself once the removal is durable; a non-root trim is refused.
#[test]
fn trim_and_discard_give_space_back() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    for options in ["", "discard"] {
        let mount = Mount::new(&image, &mnt, options);
        let before = du_kib(&image);
        fs::write(mount.path("big"), vec![1u8; 32 << 20]).unwrap();
        fs::File::open(mount.path("big"))
            .unwrap()
            .sync_all()
            .unwrap();
        let full = du_kib(&image);
        assert!(full >= before + (32 << 10), "{options}: data written");
        // The log keeps growing a little (checkpoints land in log blocks not written yet),
        // so the check is that the file's 32 MiB came back, not an exact figure.
        let given_back = |now: u64| now + (31 << 10) <= full;
        fs::remove_file(mount.path("big")).unwrap();
        if options.is_empty() {
            // The kernel frees the deleted inode (FORGET) on its own time, so the first
            // trim may come before the file's blocks are free; trim again until they are.
            for _ in 0..50 {
                let output = run(
                    common::cairn_bin().to_str().unwrap(),
                    &["trim", mnt.to_str().unwrap()],
                );
                assert!(output.status.success(), "{}", output_text(&output));
                assert!(output_text(&output).contains("trimmed"));
                if given_back(du_kib(&image)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        } else {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !given_back(du_kib(&image)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        let now = du_kib(&image);
        assert!(
            given_back(now),
            "{options}: space not given back: {before} KiB before, {full} KiB full, {now} now"
        );
        mount.unmount();
        assert_eq!(fsck(&image), 0);
    }
}

/// Blocks of the filesystem mounted at `mountpoint`, as `df` sees them (statvfs).
fn df_blocks(mountpoint: &Path) -> u64 {
    let path = std::ffi::CString::new(mountpoint.to_str().unwrap()).unwrap();
    // SAFETY: statvfs is plain data; the path is NUL-terminated.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stats) }, 0);
    stats.f_blocks
}

// `cairn grow MOUNTPOINT SIZE` grows the mounted filesystem: df shows the new size at once,
// a file kept open across the grow still reads and writes, the new space is usable, fsck
// is clean; while a deleted file is still open the grow is refused and changes nothing.
#[test]
fn online_grow_through_the_command() {
    let scratch = Scratch::new();
    let image = scratch.format("64M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    let cairn = common::cairn_bin();
    let cairn = cairn.to_str().unwrap();
    fs::write(mount.path("kept"), b"before").unwrap();
    let before = df_blocks(&mnt);
    let doomed = fs::File::create(mount.path("doomed")).unwrap();
    fs::remove_file(mount.path("doomed")).unwrap();
    let refused = run(cairn, &["grow", mnt.to_str().unwrap(), "256M"]);
    assert!(!refused.status.success());
    assert!(
        output_text(&refused).contains("deleted file"),
        "{refused:?}"
    );
    assert_eq!(df_blocks(&mnt), before);
    drop(doomed);
    let mut open = fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(mount.path("kept"))
        .unwrap();
    let output = run(cairn, &["grow", mnt.to_str().unwrap(), "256M"]);
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(
        df_blocks(&mnt) >= 3 * before,
        "{before} -> {}",
        df_blocks(&mnt)
    );
    std::io::Write::write_all(&mut open, b" after").unwrap();
    drop(open);
    assert_eq!(fs::read(mount.path("kept")).unwrap(), b"before after");
    fs::write(mount.path("big"), vec![4u8; 150 << 20]).unwrap();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// `cairn grow IMAGE SIZE` extends the image and the unmounted filesystem: the files are
// there, df shows the new size, fsck is clean.
#[test]
fn offline_grow_through_the_command() {
    let scratch = Scratch::new();
    let image = scratch.format("64M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    fs::write(mount.path("kept"), vec![3u8; 1 << 20]).unwrap();
    let before = df_blocks(&mnt);
    mount.unmount();
    let output = run(
        common::cairn_bin().to_str().unwrap(),
        &["grow", image.to_str().unwrap(), "256M"],
    );
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(output_text(&output).contains("grew from"));
    assert_eq!(fs::metadata(&image).unwrap().len(), 256 << 20);
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &mnt, "");
    assert!(
        df_blocks(&mnt) >= 3 * before,
        "{} -> {}",
        before,
        df_blocks(&mnt)
    );
    assert_eq!(fs::read(mount.path("kept")).unwrap(), vec![3u8; 1 << 20]);
    fs::write(mount.path("big"), vec![4u8; 150 << 20]).unwrap();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}
