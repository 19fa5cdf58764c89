//! How the daemon starts and stops: `mount -t fuse.NAME`, an fstab line, SIGTERM, and
//! SIGKILL in the middle of a workload followed by recovery.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Mount, Scratch, fsck, is_mounted, wait_exit};

fn mount_command(args: &[&str]) -> std::process::Output {
    common::with_ring_enabled(|| Command::new("mount").args(args).output().unwrap())
}

// `mount -t fuse.NAME` and an fstab line (through `mount -T FSTAB`) both mount with
// options, and umount leaves a clean filesystem.
#[test]
fn mount_helper_and_fstab() {
    if !common::have("mount.fuse3") {
        eprintln!("skipped: mount.fuse3 (package fuse3) is not installed");
        return;
    }
    // mount.fuse3 runs the program a `fuse.NAME` type names, found in the default PATH
    // (mount(8) drops PATH from its helpers' environment): a private name for the built
    // binary, so concurrent runs from other checkouts cannot swap it for their build.
    let helper = common::HelperName::new();
    let kind = format!("fuse.{}", helper.name);
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mnt = scratch.mountpoint();
    let (image_arg, mnt_arg) = (image.to_str().unwrap(), mnt.to_str().unwrap());
    let options = common::transport_options("noatime");
    let output = mount_command(&["-t", &kind, "-o", &options, image_arg, mnt_arg]);
    assert!(output.status.success(), "mount -t {kind}: {output:?}");
    let mount = Mount::adopt(&image, &mnt);
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    // Root's mounts are fuseblk (over a loop device), so that umount waits for the daemon.
    assert!(
        mounts.contains(&format!("{mnt_arg} fuseblk.cairn")),
        "{mounts}"
    );
    fs::write(mount.path("via-helper"), b"1").unwrap();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let fstab = scratch.dir.path().join("fstab");
    let line = format!("{image_arg} {mnt_arg} {kind} defaults,noauto,logmode=sync,dev,suid 0 0\n");
    fs::write(&fstab, line).unwrap();
    // The command line's nosuid overrides the fstab line's suid (issue 19, item 6).
    let options = common::transport_options("nosuid");
    let output = mount_command(&["-T", fstab.to_str().unwrap(), "-o", &options, mnt_arg]);
    assert!(output.status.success(), "mount from fstab: {output:?}");
    let mount = Mount::adopt(&image, &mnt);
    let flags = common::mount_flags(&mnt);
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(!flags.contains(&"nodev".to_string()), "{flags:?}");
    assert_eq!(fs::read(mount.path("via-helper")).unwrap(), b"1");
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// SIGTERM unmounts: the mount goes away, the daemon exits, fsck is clean, data is there.
#[test]
fn sigterm_unmounts_cleanly() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    fs::create_dir(mount.path("d")).unwrap();
    fs::write(mount.path("d/f"), vec![7u8; 200_000]).unwrap();
    mount.signal(libc::SIGTERM);
    assert!(
        wait_exit(mount.pid, Duration::from_secs(120)),
        "daemon ignored SIGTERM"
    );
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
    drop(mount);
    assert_eq!(fsck(&image), 0, "fsck after SIGTERM");
    let mount = Mount::new(&image, &mnt, "ro");
    assert_eq!(fs::read(mount.path("d/f")).unwrap(), vec![7u8; 200_000]);
    mount.unmount();
}

/// Writes `name` with `len` bytes of `seed`-derived data and fsyncs it.
fn write_synced(dir: &Path, name: &str, seed: u8, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let mut file = fs::File::create(dir.join(name)).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    data
}

// SIGKILL during a workload, then a new mount: a read-only mount refuses to skip
// recovery, a read-write one runs it, fsck is clean and every file fsynced before the
// kill is intact.
#[test]
fn sigkill_mid_workload_then_recovery() {
    let scratch = Scratch::new();
    let image = scratch.format("256M");
    let mnt = scratch.mountpoint();
    let mount = Mount::new(&image, &mnt, "");
    fs::create_dir(mount.path("synced")).unwrap();
    let mut synced = Vec::new();
    for i in 0..20u8 {
        let name = format!("f{i}");
        let data = write_synced(&mount.path("synced"), &name, i, 10_000 + 7_000 * i as usize);
        synced.push((name, data));
    }
    fs::File::open(mount.path("synced"))
        .unwrap()
        .sync_all()
        .unwrap();
    // Unsynced churn in flight while the daemon dies.
    let churn = mount.path("churn");
    let mut workload = Command::new("sh")
        .args([
            "-c",
            &format!(
                "mkdir -p '{d}'; i=0; while [ $i -lt 100000 ]; do \
             echo $i > '{d}/f'$i 2>/dev/null || exit 0; rm -f '{d}/f'$((i-5)) 2>/dev/null; \
             i=$((i+1)); done",
                d = churn.display()
            ),
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    mount.signal(libc::SIGKILL);
    assert!(wait_exit(mount.pid, Duration::from_secs(30)));
    let _ = workload.kill();
    let _ = workload.wait();
    drop(mount);
    assert!(!is_mounted(&mnt), "the dead mount was not detached");
    let refused = Mount::try_mount(&image, &mnt, "ro");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs recovery"), "{stderr}");
    assert!(!is_mounted(&mnt));
    let mount = Mount::new(&image, &mnt, "");
    for (name, data) in &synced {
        let read = fs::read(mount.path(&format!("synced/{name}"))).unwrap();
        assert!(&read == data, "fsynced file {name} differs after recovery");
    }
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after recovery and a clean unmount");
}
