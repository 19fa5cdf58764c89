#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! What the metadata operations a FUSE request maps to cost in the library, without FUSE:
//! create (with the open and release the kernel sends with it), lookup, getattr and unlink
//! of `CAIRN_OPS_FILES` (default 5,000) empty files in one directory, timed per phase.
//! Ignored in `cargo test`; run it release for figures, or under
//! `valgrind --tool=callgrind` for instruction counts that load does not change:
//! `cargo test --release -p cairn-fs --test ops_cost -- --ignored --nocapture`.

mod common;

use std::time::Instant;

use cairn_fs::FileKind;
use common::{make_device, mount, root};

#[test]
#[ignore = "a measurement, run by hand"]
fn create_lookup_getattr_unlink_costs() {
    let files: usize = std::env::var("CAIRN_OPS_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let device = make_device(1 << 30);
    let fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &who).unwrap().inode;
    let names: Vec<Vec<u8>> = (0..files)
        .map(|i| format!("f{i:07}").into_bytes())
        .collect();
    let time = |phase: &str, started: Instant| {
        let per = started.elapsed().as_secs_f64() * 1e6 / files as f64;
        eprintln!("{phase:<8} {per:8.2} us per file");
    };
    let started = Instant::now();
    let mut inodes = Vec::with_capacity(files);
    for name in &names {
        let made = fs
            .create(dir, name, FileKind::Regular, 0o644, 0, &who)
            .unwrap();
        let open = fs.open(made.inode, true, false, false, &who).unwrap();
        fs.release(open).unwrap();
        inodes.push(made.inode);
    }
    time("create", started);
    let started = Instant::now();
    for name in &names {
        fs.lookup(dir, name).unwrap();
    }
    time("lookup", started);
    let started = Instant::now();
    for &inode in &inodes {
        fs.getattr(inode).unwrap();
    }
    time("getattr", started);
    let started = Instant::now();
    for name in &names {
        fs.unlink(dir, name, &who).unwrap();
    }
    time("unlink", started);
    for inode in inodes {
        fs.forget(inode, 2);
    }
    fs.unmount().unwrap();
}
