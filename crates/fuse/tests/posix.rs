//! The systematic pass over POSIX behaviours through the real kernel FUSE: two Python
//! batteries (`tests/posix/`) print one line per check, and every line must be what kernel
//! XFS answered (`expected*.txt`, with the two documented differences marked there).
//!
//! To compare with XFS again: make an XFS loop mount, run
//! `python3 battery.py MNT/r` as root, and `battery_user.py MNT/u setup` as root then
//! `setpriv --reuid=65534 --regid=65534 --clear-groups python3 battery_user.py MNT/u run`,
//! and diff the outputs with the expected files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{Mount, NOBODY, Scratch, fsck, python_as, same_answers};

const BATTERY: &str = include_str!("posix/battery.py");
const BATTERY_USER: &str = include_str!("posix/battery_user.py");
const EXPECTED: &str = include_str!("posix/expected.txt");
const EXPECTED_USER: &str = include_str!("posix/expected_user.txt");

// Errno cases (long names, loops, ENOTDIR, EISDIR, rmdir and rename corners, O_EXCL,
// descriptor modes), link counts and the timestamps each call changes, as root; then
// sticky directories, directory and file permissions and owner-only changes as nobody.
// Every answer is XFS's.
#[test]
fn posix_behaviours_match_xfs() {
    let scratch = Scratch::new();
    scratch.share();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "allow_other");
    fs::set_permissions(&mount.mountpoint, fs::Permissions::from_mode(0o1777)).unwrap();
    let (root_dir, user_dir) = (mount.path("r"), mount.path("u"));
    fs::create_dir(&root_dir).unwrap();
    fs::create_dir(&user_dir).unwrap();
    let got = python_as(None, BATTERY, &[root_dir.to_str().unwrap()]);
    same_answers("as root", EXPECTED, &got);
    let user_dir = user_dir.to_str().unwrap();
    python_as(None, BATTERY_USER, &[user_dir, "setup"]);
    let got = python_as(Some(NOBODY), BATTERY_USER, &[user_dir, "run"]);
    same_answers("as nobody", EXPECTED_USER, &got);
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}
