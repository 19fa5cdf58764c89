//! Mount tests through the real kernel FUSE: basic operations, clean unmount, fsck,
//! remount, stats, refusals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirEntryExt, MetadataExt, PermissionsExt, symlink};

use common::{Mount, Scratch, fsck, run};

// Files, directories, links and attributes made through the mount survive unmount, fsck
// and remount.
#[test]
fn basic_operations_survive_remount() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    fs::create_dir_all(mount.path("a/b/c")).unwrap();
    fs::write(mount.path("a/hello.txt"), b"hello, cairn\n").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(mount.path("a/b/big.bin"), &big).unwrap();
    symlink("hello.txt", mount.path("a/link")).unwrap();
    fs::hard_link(mount.path("a/hello.txt"), mount.path("a/b/hard")).unwrap();
    fs::set_permissions(mount.path("a/hello.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    for i in 0..200 {
        fs::write(mount.path(&format!("a/b/c/f{i}")), format!("file {i}")).unwrap();
    }
    for i in 0..100 {
        fs::remove_file(mount.path(&format!("a/b/c/f{i}"))).unwrap();
    }
    fs::create_dir(mount.path("gone")).unwrap();
    fs::remove_dir(mount.path("gone")).unwrap();
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("a/b/big.bin"))
        .unwrap();
    file.seek(SeekFrom::Start(1_000_000)).unwrap();
    file.write_all(b"PATCH").unwrap();
    file.sync_all().unwrap();
    drop(file);
    check_contents(&mount, &big);
    assert_eq!(fs::read_dir(mount.path("a/b/c")).unwrap().count(), 100);
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after a clean unmount");
    let mount = Mount::new(&image, &mnt, "");
    check_contents(&mount, &big);
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

fn check_contents(mount: &Mount, big: &[u8]) {
    assert_eq!(
        fs::read(mount.path("a/hello.txt")).unwrap(),
        b"hello, cairn\n"
    );
    assert_eq!(fs::read(mount.path("a/link")).unwrap(), b"hello, cairn\n");
    assert_eq!(
        fs::read_link(mount.path("a/link")).unwrap().to_str(),
        Some("hello.txt")
    );
    let meta = fs::metadata(mount.path("a/hello.txt")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.nlink(), 2);
    let mut expected = big.to_vec();
    expected[1_000_000..1_000_005].copy_from_slice(b"PATCH");
    let mut read_back = Vec::new();
    fs::File::open(mount.path("a/b/big.bin"))
        .unwrap()
        .read_to_end(&mut read_back)
        .unwrap();
    assert!(read_back == expected, "big.bin differs");
    assert_eq!(fs::read(mount.path("a/b/c/f150")).unwrap(), b"file 150");
    assert!(!mount.path("a/b/c/f50").exists());
    assert!(!mount.path("gone").exists());
}

// `cairn stats` prints every subsystem's counters and per-request latencies.
#[test]
fn stats_are_readable_through_the_mount() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    fs::write(mount.path("x"), b"data").unwrap();
    let output = run(
        common::cairn_bin().to_str().unwrap(),
        &["stats", mount.mountpoint.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    for section in [
        "[fs]",
        "[bufcache]",
        "[journal]",
        "[alloc]",
        "[fuse requests]",
    ] {
        assert!(text.contains(section), "no {section} in:\n{text}");
    }
    assert!(
        text.contains("create"),
        "no create requests counted:\n{text}"
    );
    mount.unmount();
}

// A second mount of a mounted image is refused naming the holder; an image that is not
// cairn is refused as such; neither leaves anything mounted.
#[test]
fn busy_and_foreign_images_are_refused() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let other = scratch.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let output = Mount::try_mount(&image, &other, "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(
        stderr.contains(&mount.pid.to_string()),
        "holder pid not named: {stderr}"
    );
    assert!(!common::is_mounted(&other));
    mount.unmount();
    let foreign = scratch.dir.path().join("zeros.img");
    fs::File::create(&foreign)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let output = Mount::try_mount(&foreign, &other, "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("not a cairn filesystem"), "{stderr}");
    assert!(!common::is_mounted(&other));
}

// --help and --version work, and a bad option is a usage error (exit 2).
#[test]
fn help_version_and_usage_errors() {
    let bin = common::cairn_bin();
    let bin = bin.to_str().unwrap();
    let help = run(bin, &["--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("logmode"));
    let version = run(bin, &["--version"]);
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("cairn "));
    let bad = run(bin, &["-o", "bogus", "/nonexistent", "/nonexistent"]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(run(bin, &[]).status.code(), Some(2));
}

// fallocate (allocate, punch, zero), SEEK_DATA/SEEK_HOLE, rename with flags and
// copy_file_range through the kernel, checked by a Python script on the mount.
#[test]
fn ranges_seeks_renames_and_copies() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let script = r#"
import ctypes, errno, os, sys
d = sys.argv[1]
p = os.path.join(d, "f")
fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
os.posix_fallocate(fd, 0, 1 << 20)
assert os.fstat(fd).st_size == 1 << 20, "fallocate did not extend"
os.pwrite(fd, b"x" * 8192, 0)
os.pwrite(fd, b"y" * 4096, 512 << 10)
os.fsync(fd)
assert os.lseek(fd, 0, os.SEEK_DATA) == 0
hole = os.lseek(fd, 0, os.SEEK_HOLE)
assert hole == 8192, hole
assert os.lseek(fd, hole, os.SEEK_DATA) == 512 << 10
try:
    os.lseek(fd, 2 << 20, os.SEEK_DATA)
    raise SystemExit("SEEK_DATA past the end succeeded")
except OSError as e:
    assert e.errno == errno.ENXIO, e
os.close(fd)
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), flags)
    return 0 if r == 0 else ctypes.get_errno()
q = os.path.join(d, "g")
open(q, "w").write("g")
assert renameat2(p, q, 1) == errno.EEXIST, "RENAME_NOREPLACE replaced"
assert renameat2(p, q, 2) == 0, "RENAME_EXCHANGE failed"
assert open(p).read() == "g"
assert os.path.getsize(q) == 1 << 20
big = os.path.join(d, "big")
os.rename(q, big)
assert not os.path.exists(q) and open(big, "rb").read(1) == b"x"
os.rename(p, q)
assert not os.path.exists(p) and open(q).read() == "g"
os.mkdir(os.path.join(d, "dir1"))
os.rename(os.path.join(d, "dir1"), os.path.join(d, "dir2"))
src = os.open(big, os.O_RDONLY)
dst = os.open(os.path.join(d, "copy"), os.O_CREAT | os.O_WRONLY, 0o644)
left = 1 << 20
while left:
    n = os.copy_file_range(src, dst, left)
    assert n > 0
    left -= n
os.close(src); os.close(dst)
assert open(big, "rb").read() == open(os.path.join(d, "copy"), "rb").read()
"#;
    let mnt = mount.mountpoint.to_str().unwrap();
    let output = run("python3", &["-c", script, mnt]);
    assert!(output.status.success(), "{}", common::output_text(&output));
    common::sh(&format!(
        "cd '{mnt}' && fallocate -p -o 0 -l 4096 copy && fallocate -z -o 8192 -l 4096 copy && \
         test \"$(head -c 4096 copy | tr -d '\\0' | wc -c)\" = 0 && \
         test \"$(stat -c %s copy)\" = 1048576"
    ));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// Extended attributes through the mount: set (with create/replace flags), get, list,
// remove, a value too big for the caller's buffer, and the reserved namespace refused;
// they survive a remount.
#[test]
fn extended_attributes() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    let script = r#"
import errno, os, sys
p = os.path.join(sys.argv[1], "f")
open(p, "w").write("x")
os.setxattr(p, "user.small", b"v1")
os.setxattr(p, "user.big", b"B" * 3000)
os.setxattr(p, "user.small", b"v2", os.XATTR_REPLACE)
def fails(call, code):
    try:
        call()
    except OSError as e:
        assert e.errno == code, (e, code)
        return
    raise SystemExit(f"expected errno {code}")
fails(lambda: os.setxattr(p, "user.small", b"v3", os.XATTR_CREATE), errno.EEXIST)
fails(lambda: os.setxattr(p, "user.none", b"v", os.XATTR_REPLACE), errno.ENODATA)
fails(lambda: os.getxattr(p, "user.none"), errno.ENODATA)
fails(lambda: os.setxattr(sys.argv[1], "system.cairn.stats", b"x"), errno.EPERM)
assert os.getxattr(p, "user.small") == b"v2"
assert os.getxattr(p, "user.big") == b"B" * 3000
assert sorted(os.listxattr(p)) == ["user.big", "user.small"], os.listxattr(p)
os.removexattr(p, "user.big")
assert os.listxattr(p) == ["user.small"]
"#;
    let output = run("python3", &["-c", script, mnt.to_str().unwrap()]);
    assert!(output.status.success(), "{}", common::output_text(&output));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &mnt, "ro");
    let check = "import os,sys; p=os.path.join(sys.argv[1],'f'); \
                 assert os.getxattr(p,'user.small')==b'v2'; assert os.listxattr(p)==['user.small']";
    let output = run("python3", &["-c", check, mnt.to_str().unwrap()]);
    assert!(output.status.success(), "{}", common::output_text(&output));
    mount.unmount();
}

// The mount's bdi (crates/fuse/src/bdi.rs): a 4 MiB readahead window by default where the
// kernel gives FUSE mounts 128 KiB, `readahead=SIZE` sets it, `readahead=0` keeps the
// kernel's; a 10% share of the dirty page limit by default where the kernel gives 1%,
// `dirty_ratio=N` sets it, `dirty_ratio=0` and `buffered` keep the kernel's, and the
// kernel's strict limit stays.
#[test]
fn bdi_settings_follow_the_options() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    for (options, kib, percent) in [
        ("", "4096", "10"),
        ("readahead=1M,dirty_ratio=20", "1024", "20"),
        ("readahead=0,dirty_ratio=0", "128", "1"),
        ("buffered", "4096", "1"),
    ] {
        let mount = Mount::new(&image, &mnt, options);
        let dev = fs::metadata(&mnt).unwrap().dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let attribute = |name: &str| {
            let blk = format!("/sys/class/bdi/{major}:{minor}-fuseblk/{name}");
            let plain = format!("/sys/class/bdi/{major}:{minor}/{name}");
            let value = fs::read_to_string(&blk).or_else(|_| fs::read_to_string(&plain));
            value.unwrap().trim().to_string()
        };
        assert_eq!(attribute("read_ahead_kb"), kib, "-o {options}");
        assert_eq!(attribute("max_ratio"), percent, "-o {options}");
        assert_eq!(attribute("strict_limit"), "1", "-o {options}");
        mount.unmount();
    }
}

// Large sequential transfers, the paths that skip copies (write data straight from the
// request buffer, reads straight into the reply buffer): O_DIRECT and buffered, whole and
// odd-sized requests, and unaligned offsets, read back the same after a remount.
#[test]
fn large_transfers_round_trip() {
    let scratch = Scratch::new();
    let image = scratch.format("512M");
    let mnt = scratch.mountpoint();
    let source = scratch.dir.path().join("source");
    let data: Vec<u8> = (0..(20u32 << 20) + 12345)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(&source, &data).unwrap();
    let mount = Mount::new(&image, &mnt, "");
    let (src, m) = (source.to_str().unwrap(), mnt.to_str().unwrap());
    common::sh(&format!(
        "dd if={src} of={m}/direct bs=1M count=20 oflag=direct conv=fsync status=none
         dd if={src} of={m}/odd bs=777777 status=none
         dd if={src} of={m}/shifted bs=1M seek=4097 oflag=seek_bytes status=none"
    ));
    mount.unmount();
    let mount = Mount::new(&image, &mnt, "");
    assert!(fs::read(mount.path("direct")).unwrap() == data[..20 << 20]);
    assert!(fs::read(mount.path("odd")).unwrap() == data);
    let shifted = fs::read(mount.path("shifted")).unwrap();
    assert!(shifted[..4097].iter().all(|&b| b == 0) && shifted[4097..] == data);
    let direct = common::sh(&format!(
        "dd if={m}/direct bs=1M iflag=direct status=none | cmp - {src} 2>&1 || true"
    ));
    assert!(
        direct.contains("EOF on -"),
        "O_DIRECT read differs: {direct}"
    );
    mount.unmount();
}

/// `inodes_cached` from `cairn stats` of the mount.
fn inodes_cached(mount: &Mount) -> u64 {
    let output = run(
        common::cairn_bin().to_str().unwrap(),
        &["stats", mount.mountpoint.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("inodes_cached:"));
    line.and_then(|l| l.split(':').nth(1)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no inodes_cached in:\n{text}"))
}

// A listing carries attributes for a small directory's entries (so stat-ing them needs no
// lookups) but not past the first reply of a big one: a plain listing of a big directory
// loads few inodes. Either way every name comes back with its inode number and type.
#[test]
fn listings_load_inodes_only_for_small_directories() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    fs::create_dir_all(mount.path("small")).unwrap();
    fs::create_dir_all(mount.path("big")).unwrap();
    let long = "a-name-long-enough-to-fill-the-directory-fast";
    for i in 0..200 {
        fs::write(mount.path(&format!("small/f{i}")), b"").unwrap();
    }
    for i in 0..3_000 {
        fs::write(mount.path(&format!("big/{long}-{i}")), b"").unwrap();
    }
    symlink("f0", mount.path("small/link")).unwrap();
    mount.unmount();
    let mount = Mount::new(&image, &mnt, "");
    let before = inodes_cached(&mount);
    let big: Vec<_> = fs::read_dir(mount.path("big"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(big.len(), 3_000);
    let loaded = inodes_cached(&mount) - before;
    assert!(
        loaded < 200,
        "a plain listing of 3,000 entries loaded {loaded} inodes"
    );
    for entry in &big {
        let meta = fs::symlink_metadata(entry.path()).unwrap();
        assert_eq!(entry.ino(), meta.ino());
        assert!(entry.file_type().unwrap().is_file());
    }
    let before = inodes_cached(&mount);
    let small: Vec<_> = fs::read_dir(mount.path("small"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(small.len(), 201);
    assert!(
        inodes_cached(&mount) - before >= 200,
        "a small listing carried no attributes"
    );
    let link = small.iter().find(|e| e.file_name() == "link").unwrap();
    assert!(link.file_type().unwrap().is_symlink());
    drop((big, small)); // entries keep their directory open
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

/// Writes a file, removes it (by `rm`, or by `mv` of a small file over it) and reads
/// `statvfs` at once, many times: the space must show as free every time.
const RM_THEN_DF: &str = r#"
import os, sys
root = sys.argv[1]
def free():
    st = os.statvfs(root)
    return st.f_bfree * st.f_frsize
def write(path, chunks):
    with open(path, "wb") as f:
        for _ in range(chunks):
            f.write(chunk)
        os.fsync(f.fileno())
chunk = os.urandom(1 << 20)
small = os.path.join(root, "small")
write(small, 1)
empty = free()
for round in range(16):
    path = os.path.join(root, "big%d" % round)
    write(path, 16)
    if round % 2:
        os.rename(small, path)
    else:
        os.unlink(path)
    if free() < empty:
        sys.exit("round %d: blocks still in use after the name went" % round)
    if round % 2:
        os.rename(path, small)
"#;

// `rm` or `mv` over a file, then `df`: the kernel may send the FORGET that frees the inode
// after the STATFS, so the unlink or rename itself frees the data of a file nobody has open
// (8 rounds of 20 failed before).
#[test]
fn space_is_free_right_after_unlink() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let output = run(
        common::python(),
        &["-c", RM_THEN_DF, mount.mountpoint.to_str().unwrap()],
    );
    assert!(output.status.success(), "{}", common::output_text(&output));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}
