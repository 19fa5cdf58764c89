#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Shared extents through the kernel: plain `cp` (coreutils tries `copy_file_range`) shares
//! the file's blocks, so it takes no space; a small write into the copy takes a block and
//! leaves the original alone, and so do writes through mmap, O_DIRECT and a punch; removing
//! the original frees nothing the copy uses, removing both frees everything; the bytes hold
//! across a remount and fsck is clean. FICLONE never reaches a FUSE daemon, so
//! `cp --reflink=always` fails (as on every FUSE filesystem).
//! The CoW extent size hint through FS_IOC_FSSETXATTR answers as XFS does and shapes the
//! copies.

mod common;

use common::{Mount, Scratch, fsck, python_as, run, same_answers, sh};

const COWEXTSIZE: &str = include_str!("reflink/cowextsize.py");
const COWEXTSIZE_EXPECTED: &str = include_str!("reflink/cowextsize_expected.txt");

const MIB: u64 = 1 << 20;

/// Used KiB of the filesystem mounted at `mnt`, as df shows it.
fn used_kib(mnt: &str) -> u64 {
    sh(&format!("sync && df -k --output=used '{mnt}' | tail -1"))
        .trim()
        .parse()
        .unwrap()
}

fn checksum(path: &str) -> String {
    sh(&format!("sha256sum '{path}' | cut -c1-64"))
}

#[test]
fn cp_shares_blocks_and_copy_on_write_keeps_the_original() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let mnt = mount.mountpoint.to_str().unwrap().to_string();
    sh(&format!(
        "head -c {} /dev/urandom > '{mnt}/src' && sync",
        64 * MIB + 1234
    ));
    let original = checksum(&format!("{mnt}/src"));
    let before = used_kib(&mnt);
    let copied = run("cp", &[&format!("{mnt}/src"), &format!("{mnt}/copy")]);
    assert!(copied.status.success(), "{}", common::output_text(&copied));
    let after_cp = used_kib(&mnt);
    assert!(
        after_cp - before <= 256,
        "cp took {} KiB",
        after_cp - before
    );
    assert_eq!(checksum(&format!("{mnt}/copy")), original);
    sh(&format!(
        "dd if=/dev/zero of='{mnt}/copy' bs=4096 count=1 seek=10 conv=notrunc status=none"
    ));
    let after_write = used_kib(&mnt);
    assert!(
        after_write - after_cp <= 16 * 1024,
        "a 4 KiB write took {} KiB",
        after_write - after_cp
    );
    assert_eq!(checksum(&format!("{mnt}/src")), original);
    // Through mmap, O_DIRECT and a punch too: each changes the copy only.
    let mut want = std::fs::read(format!("{mnt}/src")).unwrap();
    want[40960..45056].fill(0);
    sh(&format!(
        "python3 -c \"import mmap, os; fd = os.open('{mnt}/copy', os.O_RDWR); \
         m = mmap.mmap(fd, 0); m[200000:200010] = b'x' * 10; m.flush(); m.close(); \
         os.close(fd)\" && \
         dd if=/dev/zero of='{mnt}/copy' bs=4096 count=2 seek=100 oflag=direct \
         conv=notrunc status=none && \
         fallocate -p -o {MIB} -l 65536 '{mnt}/copy'"
    ));
    want[200000..200010].fill(b'x');
    want[409600..417792].fill(0);
    want[MIB as usize..MIB as usize + 65536].fill(0);
    assert_eq!(checksum(&format!("{mnt}/src")), original);
    let copy = std::fs::read(format!("{mnt}/copy")).unwrap();
    assert!(copy == want, "the copy's bytes differ from the writes made");
    let changed = checksum(&format!("{mnt}/copy"));
    assert_ne!(changed, original);
    let stats = sh(&format!("{} stats '{mnt}'", common::cairn_bin().display()));
    assert!(
        stats.contains("clones: 1") && stats.contains("cow_blocks: "),
        "{stats}"
    );
    // FICLONE is not passed to FUSE daemons: --reflink=always cannot work.
    let always = run(
        "cp",
        &[
            "--reflink=always",
            &format!("{mnt}/src"),
            &format!("{mnt}/clone"),
        ],
    );
    assert!(!always.status.success());
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    assert_eq!(checksum(&format!("{mnt}/src")), original);
    assert_eq!(checksum(&format!("{mnt}/copy")), changed);
    sh(&format!("rm '{mnt}/src'"));
    let without_src = used_kib(&mnt);
    assert!(
        without_src + 1024 >= after_write,
        "removing the original freed the copy's blocks: {without_src} KiB used, \
         {after_write} before"
    );
    assert_eq!(checksum(&format!("{mnt}/copy")), changed);
    sh(&format!("rm -f '{mnt}/copy' '{mnt}/clone'"));
    let empty = used_kib(&mnt);
    assert!(
        empty <= before - 64 * 1024 + 64,
        "{empty} KiB used after removing both"
    );
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

/// The `cow_blocks` counter of the daemon serving `mnt`.
fn cow_blocks(mnt: &str) -> u64 {
    let json = sh(&format!(
        "{} stats --json '{mnt}'",
        common::cairn_bin().display()
    ));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["reflink"]["cow_blocks"].as_u64().unwrap()
}

// FS_IOC_FSSETXATTR's cowextsize answers as kernel XFS's (the flag it needs, whole blocks,
// inheritance, clearing); then a 4 KiB write into a `cp` made in a directory with a 64 KiB
// hint copies one whole 64 KiB unit, leaves the original alone, and the hint survives a
// remount with fsck clean.
#[test]
fn cow_extent_size_hint_through_fssetxattr() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let mnt = mount.mountpoint.to_str().unwrap().to_string();
    let got = python_as(None, COWEXTSIZE, &[&mnt]);
    same_answers("cowextsize", COWEXTSIZE_EXPECTED, &got);
    let cairn = common::cairn_bin().display().to_string();
    let set = sh(&format!(
        "mkdir '{mnt}/vm' && {cairn} extsize --cow -s 64K '{mnt}/vm'"
    ));
    assert!(set.contains("CoW extent size hint 65536 bytes"), "{set}");
    sh(&format!(
        "head -c {} /dev/urandom > '{mnt}/vm/disk' && cp '{mnt}/vm/disk' '{mnt}/vm/copy'",
        4 * MIB
    ));
    let original = checksum(&format!("{mnt}/vm/disk"));
    let before = cow_blocks(&mnt);
    sh(&format!(
        "dd if=/dev/zero of='{mnt}/vm/copy' bs=4096 count=1 seek=37 conv=notrunc,fsync \
         status=none"
    ));
    assert_eq!(cow_blocks(&mnt) - before, 16, "a 64 KiB unit is 16 blocks");
    assert_eq!(checksum(&format!("{mnt}/vm/disk")), original);
    let mut want = std::fs::read(format!("{mnt}/vm/disk")).unwrap();
    want[37 * 4096..38 * 4096].fill(0);
    assert!(std::fs::read(format!("{mnt}/vm/copy")).unwrap() == want);
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let hint = sh(&format!("{cairn} extsize --cow '{mnt}/vm/copy'"));
    assert!(hint.contains("CoW extent size hint 65536 bytes"), "{hint}");
    assert!(std::fs::read(format!("{mnt}/vm/copy")).unwrap() == want);
    mount.unmount();
}

/// Clones `MNT/src` into an O_TMPFILE file, writes a block into it and links it as
/// `MNT/linked`; then clones a second unnamed file into `MNT/named`.
const TMPFILE_CLONES: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
size = os.path.getsize(f"{d}/src")
src = os.open(f"{d}/src", os.O_RDONLY)
tmp = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o644)
done = 0
while done < size:
    done += os.copy_file_range(src, tmp, size - done, done, done)
os.pwrite(tmp, b"\x07" * 4096, 8192)
os.fsync(tmp)
proc_path, linked = f"/proc/self/fd/{tmp}".encode(), f"{d}/linked".encode()
assert libc.linkat(-100, proc_path, -100, linked, 0x400) == 0, ctypes.get_errno()
other = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o644)
os.pwrite(other, b"\x05" * size, 0)
named = os.open(f"{d}/named", os.O_CREAT | os.O_WRONLY, 0o644)
done = 0
while done < size:
    done += os.copy_file_range(other, named, size - done, done, done)
print("copied", done)
"#;

// O_TMPFILE files on both sides of `copy_file_range` through the kernel: a clone into an
// unnamed file, written and then linked, and a clone out of one; the original keeps its
// bytes, the daemon counts both clones, and fsck is clean after the unnamed file goes.
#[test]
fn tmpfiles_clone_both_ways() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let mnt = mount.mountpoint.to_str().unwrap().to_string();
    sh(&format!("head -c {} /dev/urandom > '{mnt}/src'", 2 * MIB));
    let original = std::fs::read(format!("{mnt}/src")).unwrap();
    let said = python_as(None, TMPFILE_CLONES, &[&mnt]);
    assert!(said.contains(&format!("copied {}", 2 * MIB)), "{said}");
    let mut want = original.clone();
    want[8192..12288].fill(7);
    assert!(std::fs::read(format!("{mnt}/linked")).unwrap() == want);
    assert!(std::fs::read(format!("{mnt}/src")).unwrap() == original);
    assert!(std::fs::read(format!("{mnt}/named")).unwrap() == vec![5u8; 2 * MIB as usize]);
    let stats = sh(&format!("{} stats '{mnt}'", common::cairn_bin().display()));
    assert!(stats.contains("clones: 2"), "{stats}");
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}
