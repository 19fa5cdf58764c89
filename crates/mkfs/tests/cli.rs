//! mkfs.cairn as users run it: geometry output, refusals and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use cairn::{LockHolder, output_text as text};

fn mkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mkfs-cairn"))
        .args(args)
        .output()
        .unwrap()
}

fn image(dir: &tempfile::TempDir, name: &str) -> String {
    dir.path().join(name).display().to_string()
}

// Creating an image with -s prints the geometry and leaves a sparse file of that size.
#[test]
fn creates_image_and_prints_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "a.img");
    let out = mkfs(&["-s", "64M", "-L", "data", &path]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    for field in [
        "agcount=4",
        "bsize=4096",
        "internal log",
        "label='data'",
        "root",
    ] {
        assert!(said.contains(field), "missing {field} in:\n{said}");
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 20);
}

// An existing filesystem is refused without -f (naming what is there) and replaced with it.
#[test]
fn refuses_existing_filesystem_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "b.img");
    assert!(mkfs(&["-q", "-s", "16M", &path]).status.success());
    let again = mkfs(&["-q", &path]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again).contains("holds a cairn filesystem"),
        "{}",
        text(&again)
    );
    assert!(text(&again).contains("-f"));
    assert!(mkfs(&["-q", "-f", &path]).status.success());
}

// Other filesystems' signatures are recognised too.
#[test]
fn refuses_foreign_filesystem_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "ext.img");
    let mut bytes = vec![0u8; 16 << 20];
    bytes[1080] = 0x53;
    bytes[1081] = 0xef;
    std::fs::write(&path, bytes).unwrap();
    let out = mkfs(&["-q", &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("ext2/ext3/ext4"), "{}", text(&out));
}

// -n prints the plan and writes nothing, not even a new file.
#[test]
fn dry_run_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "c.img");
    std::fs::write(&path, vec![0u8; 16 << 20]).unwrap();
    let out = mkfs(&["-n", &path]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("agcount="));
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
    let missing = image(&dir, "missing.img");
    assert_eq!(mkfs(&["-n", "-s", "16M", &missing]).status.code(), Some(1));
    assert!(!Path::new(&missing).exists());
}

// A missing device without -s, and a device too small, are clear errors.
#[test]
fn missing_and_too_small_devices() {
    let dir = tempfile::tempdir().unwrap();
    let missing = mkfs(&[&image(&dir, "nope.img")]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing).contains("does not exist"),
        "{}",
        text(&missing)
    );
    let small = mkfs(&["-s", "1M", &image(&dir, "small.img")]);
    assert_eq!(small.status.code(), Some(1));
    assert!(text(&small).contains("needs at least"), "{}", text(&small));
}

// Wrong arguments exit 2 with a usage message; --help and --version exit 0.
#[test]
fn wrong_arguments_are_usage_errors() {
    for args in [
        &["--bogus", "x"][..],
        &["-b", "12Q", "x"],
        &[],
        &["-a", "2", "-A", "1G", "x"],
    ] {
        let out = mkfs(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad_block = mkfs(&["-s", "16M", "-b", "3000", &image(&dir, "d.img")]);
    assert_eq!(bad_block.status.code(), Some(1));
    assert!(
        text(&bad_block).contains("block_size"),
        "{}",
        text(&bad_block)
    );
    assert_eq!(mkfs(&["--help"]).status.code(), Some(0));
    assert!(text(&mkfs(&["--version"])).contains("mkfs.cairn"));
}

// An image locked by another process is refused with a message naming that process.
#[test]
fn device_held_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "held.img");
    std::fs::write(&path, vec![0u8; 16 << 20]).unwrap();
    let holder = LockHolder::new(Path::new(&path));
    let out = mkfs(&["-q", &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(&format!("pid {}", holder.pid())),
        "{}",
        text(&out)
    );
}
