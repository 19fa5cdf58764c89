//! cairn-db on a populated image: every command answers, paths resolve, freesp totals match
//! fsck's, and it reads an image that a writer holds locked (a mounted filesystem).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn::LockHolder;
use common::{populated, text};

fn db(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_cairn-db"), args)
}

// Each command succeeds and prints what it is for; a locked image is still readable.
#[test]
fn every_command_answers() {
    let image = populated();
    let path = image.path.to_str().unwrap();
    let _holder = LockHolder::new(&image.path);
    let sb = db(&[path, "sb"]);
    assert_eq!(sb.status.code(), Some(0), "{}", text(&sb));
    assert!(text(&sb).contains("root_inode"), "{}", text(&sb));
    let freesp = db(&[path, "freesp"]);
    let said = text(&freesp);
    assert!(
        said.contains("from") && said.contains("pct") && said.contains("all AGs"),
        "{said}"
    );
    let frag = text(&db(&[path, "frag"]));
    assert!(frag.contains("actual 1, ideal 1"), "{frag}");
    let bmap = text(&db(&[path, "bmap", "/f1"]));
    assert!(
        bmap.contains(&format!("inode {}: 1 extents", image.f1)),
        "{bmap}"
    );
    assert!(bmap.contains("AG "), "{bmap}");
    let by_number = text(&db(&[path, "bmap", &image.f1.to_string()]));
    assert_eq!(by_number, bmap);
    let inode = text(&db(&[path, "inode", &image.f2.to_string()]));
    assert!(inode.contains("nlink: 2"), "{inode}");
    let log = text(&db(&[path, "logprint"]));
    assert!(log.contains("unmount") && log.contains("records"), "{log}");
    let missing = db(&[path, "bmap", "/no/such"]);
    assert_eq!(missing.status.code(), Some(8), "{}", text(&missing));
    assert_eq!(db(&[path]).status.code(), Some(16));
}
