//! What a crash (SIGKILL of the daemon) leaves of files nobody `fsync`ed, through a real
//! mount with the default options, and what `sync` then makes durable:
//! - issue 34: a new file comes back absent or shorter than written with its bytes right,
//!   never full of zeros; a file replaced by a rename holds its old content or its new one;
//! - issue 33: `cairn sync` makes everything durable at once, and anything the daemon
//!   received is durable a commit window later (`sync -f` hands it the kernel's pages).
//!
//! Each test kills the daemon, mounts the image again (recovery), checks the contents,
//! unmounts and runs fsck.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Mount, NOBODY, Scratch, fsck, run, run_as, wait_exit};

/// The default commit window (`-o commit=`), and how much longer the tests wait.
const WINDOW: Duration = Duration::from_secs(5);
const MARGIN: Duration = Duration::from_secs(1);

/// Kills the daemon (SIGKILL: nothing is written back), mounts the image again with
/// `options` and returns the new mount.
fn crash_and_remount(mount: Mount, options: &str) -> Mount {
    let (image, mountpoint) = (mount.device.clone(), mount.mountpoint.clone());
    mount.signal(libc::SIGKILL);
    assert!(
        wait_exit(mount.pid, Duration::from_secs(30)),
        "the daemon did not die"
    );
    drop(mount);
    Mount::new(&image, &mountpoint, options)
}

/// Unmounts cleanly and checks the image.
fn finish(mount: Mount) {
    let image = mount.device.clone();
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after the crash and a clean unmount");
}

/// Creates `path` with `data` and fsyncs it: some other program's durable file.
fn write_fsynced(path: &Path, data: &[u8]) {
    let mut file = fs::File::create(path).unwrap();
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}

/// `sync -f PATH`: syncfs on the mount, which hands the kernel's dirty pages to the daemon
/// (and no more: FUSE sends its sync request to virtiofs only).
fn sync_f(path: &Path) {
    let output = run("sync", &["-f", path.to_str().unwrap()]);
    assert!(output.status.success(), "sync -f: {output:?}");
}

fn cairn_sync(id: Option<u32>, path: &Path) {
    let cairn = common::cairn_bin();
    let output = run_as(
        id,
        cairn.to_str().unwrap(),
        &["sync", path.to_str().unwrap()],
    );
    assert!(output.status.success(), "cairn sync: {output:?}");
}

// Issue 34, case 1: twenty files written with echo (no fsync), `sync -f`, then another
// program's fsync, then SIGKILL. Each file is absent or a prefix of what was written; before,
// all twenty came back at full size holding only NULs.
#[test]
fn new_files_after_a_kill_hold_no_zeros() {
    let scratch = Scratch::new();
    let mount = Mount::new(&scratch.format("256M"), &scratch.mountpoint(), "");
    let mut written = Vec::new();
    for index in 1..=20 {
        let path = mount.path(&format!("a{index}"));
        let text = format!("hello world {index}\n");
        fs::write(&path, &text).unwrap();
        written.push((path, text.into_bytes()));
    }
    sync_f(&written[0].0);
    write_fsynced(&mount.path("b"), b"another program's data\n");
    let mount = crash_and_remount(mount, "");
    for (path, text) in &written {
        match fs::read(path) {
            Ok(found) => assert!(text.starts_with(&found), "{}: {found:?}", path.display()),
            Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound),
        }
    }
    assert_eq!(
        fs::read(mount.path("b")).unwrap(),
        b"another program's data\n"
    );
    finish(mount);
}

// Issue 34, case 2: ten files fsynced with old content, each replaced by a temporary renamed
// over it (`mv`, no fsync), `sync -f`, another program's fsync, SIGKILL. Each holds exactly its
// old or its new content; before, all ten held NULs.
#[test]
fn files_replaced_by_rename_hold_old_or_new_content_after_a_kill() {
    let scratch = Scratch::new();
    let mount = Mount::new(&scratch.format("256M"), &scratch.mountpoint(), "");
    for index in 1..=10 {
        write_fsynced(
            &mount.path(&format!("c{index}")),
            format!("old content {index}\n").as_bytes(),
        );
    }
    fs::File::open(&mount.mountpoint)
        .unwrap()
        .sync_all()
        .unwrap();
    for index in 1..=10 {
        let temporary = mount.path(&format!("c{index}.tmp"));
        fs::write(&temporary, format!("new content {index}\n")).unwrap();
        fs::rename(&temporary, mount.path(&format!("c{index}"))).unwrap();
    }
    sync_f(&mount.path("c1"));
    write_fsynced(&mount.path("b"), b"another program's data\n");
    let mount = crash_and_remount(mount, "");
    for index in 1..=10 {
        let found = fs::read_to_string(mount.path(&format!("c{index}"))).unwrap();
        let (old, new) = (
            format!("old content {index}\n"),
            format!("new content {index}\n"),
        );
        assert!(found == old || found == new, "c{index}: {found:?}");
    }
    finish(mount);
}

/// Files and directories a test writes without fsync: (path, content; `None`: a directory).
fn unsynced_tree(mount: &Mount) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut tree = Vec::new();
    let dir = mount.path("newdir");
    fs::create_dir(&dir).unwrap();
    tree.push((dir.clone(), None));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(dir.join("data"), &data).unwrap();
    tree.push((dir.join("data"), Some(data)));
    fs::write(mount.path("small"), b"a small new file\n").unwrap();
    tree.push((mount.path("small"), Some(b"a small new file\n".to_vec())));
    tree
}

fn check_tree(tree: &[(PathBuf, Option<Vec<u8>>)]) {
    for (path, content) in tree {
        match content {
            None => assert!(path.is_dir(), "{} is gone", path.display()),
            Some(data) => assert!(
                fs::read(path).unwrap() == *data,
                "{} differs",
                path.display()
            ),
        }
    }
}

// Issue 33: data and a new file, then `cairn sync` and SIGKILL at once: all of it is there
// after the remount. An unprivileged user may run `cairn sync` too.
#[test]
fn cairn_sync_makes_everything_durable() {
    let scratch = Scratch::new();
    scratch.share();
    let mount = Mount::new(
        &scratch.format("256M"),
        &scratch.mountpoint(),
        "allow_other",
    );
    let tree = unsynced_tree(&mount);
    cairn_sync(None, &mount.mountpoint);
    let mount = crash_and_remount(mount, "allow_other");
    check_tree(&tree);
    fs::set_permissions(&mount.mountpoint, fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = mount.path("theirs");
    let script = format!("echo theirs > '{}'", theirs.display());
    let output = run_as(Some(NOBODY), "sh", &["-c", &script]);
    assert!(output.status.success(), "{output:?}");
    cairn_sync(Some(NOBODY), &theirs);
    let mount = crash_and_remount(mount, "allow_other");
    let found = fs::read_to_string(mount.path("theirs")).unwrap();
    assert_eq!(found, "theirs\n");
    check_tree(&tree);
    finish(mount);
}

// Issue 33: data written, `sync -f` (the kernel's pages reach the daemon), then a wait of
// the default window and a second, then SIGKILL: all of it is there.
#[test]
fn sync_then_the_commit_window_makes_data_durable() {
    let scratch = Scratch::new();
    let mount = Mount::new(&scratch.format("256M"), &scratch.mountpoint(), "");
    let tree = unsynced_tree(&mount);
    sync_f(&mount.mountpoint);
    std::thread::sleep(WINDOW + MARGIN);
    let mount = crash_and_remount(mount, "");
    check_tree(&tree);
    finish(mount);
}

// Issue 33: a new directory and file (metadata reaches the daemon at once) and nothing else,
// a wait of the window (`-o commit=2` here) and a second, then SIGKILL: both are there.
#[test]
fn new_names_are_durable_a_commit_window_later() {
    let scratch = Scratch::new();
    let mount = Mount::new(&scratch.format("256M"), &scratch.mountpoint(), "commit=2");
    fs::create_dir_all(mount.path("d/e")).unwrap();
    fs::File::create(mount.path("d/e/empty")).unwrap();
    std::thread::sleep(Duration::from_secs(2) + MARGIN);
    let mount = crash_and_remount(mount, "commit=2");
    assert!(mount.path("d/e/empty").is_file());
    finish(mount);
}
