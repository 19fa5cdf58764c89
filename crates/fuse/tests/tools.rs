//! Real tools on a real mount: cp -a, tar, rsync, git and SQLite on an image file and on
//! a loop device, then unmount, fsck, remount and compare.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::path::Path;

use common::{Mount, Scratch, checksums, fsck, have, sh};

/// A source tree to copy: this crate's and the filesystem core's sources plus some
/// generated files (a sparse file, an empty file, a symlink, a deep directory).
fn make_source_tree(root: &Path) {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    sh(&format!(
        "mkdir -p '{root}' && cp -a '{fs}' '{root}/fs' && cp -a '{fuse}' '{root}/fuse' && \
         cd '{root}' && mkdir -p deep/a/b/c/d/e && echo leaf > deep/a/b/c/d/e/leaf && \
         : > empty && truncate -s 5M sparse && printf x | dd of=sparse bs=1 seek=3000000 \
         conv=notrunc status=none && ln -s deep/a link && \
         head -c 4000000 /dev/urandom > random.bin && chmod 640 random.bin",
        root = root.display(),
        fs = crates.join("fs/src").display(),
        fuse = crates.join("fuse/src").display(),
    ));
}

/// cp -a and tar in and out, rsync, git and sqlite on `mount`; returns the checksums of
/// what the mount must hold afterwards.
fn exercise(mount: &Mount, source: &Path, scratch: &Path) -> String {
    let mnt = mount.mountpoint.display();
    let src = source.display();
    let scratch = scratch.display();
    sh(&format!("cp -a '{src}' '{mnt}/copy'"));
    assert_eq!(
        checksums(source),
        checksums(&mount.path("copy")),
        "cp -a in"
    );
    sh(&format!(
        "mkdir -p '{mnt}/untar' && tar -C '{src}' -cf - . | tar -C '{mnt}/untar' -xf -"
    ));
    assert_eq!(checksums(source), checksums(&mount.path("untar")), "tar in");
    sh(&format!(
        "mkdir '{scratch}/out' && tar -C '{mnt}/copy' -cf - . | tar -C '{scratch}/out' -xf -"
    ));
    assert_eq!(
        checksums(source),
        checksums(Path::new(&format!("{scratch}/out"))),
        "tar out"
    );
    if have("rsync") {
        sh(&format!(
            "rsync -a '{src}/' '{mnt}/rsynced/' && rsync -a --delete '{src}/' '{mnt}/rsynced/'"
        ));
        assert_eq!(
            checksums(source),
            checksums(&mount.path("rsynced")),
            "rsync"
        );
    }
    git_round(mount);
    if have("sqlite3") {
        sqlite_round(mount);
    }
    checksums(&mount.mountpoint)
}

fn git_round(mount: &Mount) {
    let repo = mount.path("repo");
    sh(&format!(
        "git init -q '{repo}' && cd '{repo}' && cp -a ../copy/fs . && \
         git -c user.name=t -c user.email=t@t add -A && \
         git -c user.name=t -c user.email=t@t commit -q -m first && \
         echo more >> fs/lib.rs && git -c user.name=t -c user.email=t@t commit -q -am second && \
         git gc -q && git fsck --strict --no-progress",
        repo = repo.display()
    ));
    let log = sh(&format!(
        "cd '{}' && git log --oneline | wc -l",
        repo.display()
    ));
    assert_eq!(log.trim(), "2");
}

fn sqlite_round(mount: &Mount) {
    let db = mount.path("test.db");
    let script = "create table t(id integer primary key, v text); \
                  with recursive n(i) as (select 1 union all select i+1 from n where i<20000) \
                  insert into t(v) select hex(randomblob(40)) from n; \
                  create index tv on t(v); delete from t where id % 3 = 0; vacuum;";
    sh(&format!("sqlite3 '{}' '{script}'", db.display()));
    let check = sh(&format!(
        "sqlite3 '{}' 'pragma integrity_check; select count(*) from t;'",
        db.display()
    ));
    assert_eq!(
        check.split_whitespace().collect::<Vec<_>>(),
        ["ok", "13334"]
    );
}

// Real tools on an image file; after unmount fsck is clean and a remount shows the same
// contents.
#[test]
fn real_tools_on_an_image() {
    let scratch = Scratch::new();
    let image = scratch.format("1G");
    let source = scratch.dir.path().join("source");
    make_source_tree(&source);
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let before = exercise(&mount, &source, scratch.dir.path());
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after real tools");
    let mount = Mount::new(&image, &scratch.mountpoint(), "ro");
    assert_eq!(
        before,
        checksums(&mount.mountpoint),
        "contents changed across remount"
    );
    mount.unmount();
}

/// A loop device over `image`, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(image: &Path) -> Option<Loop> {
        let output = common::run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        if !output.status.success() {
            eprintln!(
                "skipped: losetup: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            return None;
        }
        Some(Loop(
            String::from_utf8_lossy(&output.stdout).trim().to_string(),
        ))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = common::run("losetup", &["-d", &self.0]);
    }
}

// The same round on a loop device used as a raw block device (skipped, saying why, where
// loop devices cannot be attached).
#[test]
fn real_tools_on_a_loop_device() {
    let scratch = Scratch::new();
    let image = scratch.image();
    fs::File::create(&image)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let Some(device) = Loop::attach(&image) else {
        return;
    };
    let device_path = Path::new(&device.0).to_owned();
    common::mkfs(&device_path, &[]);
    let source = scratch.dir.path().join("source");
    make_source_tree(&source);
    let mount = Mount::new(&device_path, &scratch.mountpoint(), "");
    let before = exercise(&mount, &source, scratch.dir.path());
    mount.unmount();
    assert_eq!(fsck(&device_path), 0, "fsck of the loop device");
    let mount = Mount::new(&device_path, &scratch.mountpoint(), "");
    assert_eq!(before, checksums(&mount.mountpoint));
    mount.unmount();
}
