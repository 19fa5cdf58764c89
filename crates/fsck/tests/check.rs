//! fsck.cairn on fresh images of several sizes, on every metadata block damaged in turn, and
//! on wrong arguments and unusable devices.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::OpenOptions as FsOpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::{Command, Output};

use cairn::{LockHolder, output_text as text};
use cairn_blockdev::{FileDevice, OpenOptions};
use cairn_format::MetaKind;
use cairn_format::limits::AG_FIRST_FREE;
use cairn_mkfs::{FormatOptions, Request, format, plan};

fn fsck(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsck-cairn"))
        .args(args)
        .output()
        .unwrap()
}

/// Formats a fresh image of `bytes` at `path` through the mkfs library.
fn make_image(path: &std::path::Path, bytes: u64, request: &Request) -> cairn_mkfs::Plan {
    let options = OpenOptions {
        create_size: Some(bytes),
        ..OpenOptions::default()
    };
    let device = FileDevice::open(path, &options).unwrap();
    let sector = request.sector_size.unwrap_or(4096);
    let plan = plan(bytes, sector, request).unwrap();
    let format_options = FormatOptions {
        uuid: None,
        discard: true,
        now_secs: 1,
    };
    format(&device, &plan, &format_options).unwrap();
    plan
}

// Fresh images of 16 MiB, 1 GiB and a sparse 1 TiB are clean.
#[test]
fn fresh_images_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [("16m", 16u64 << 20), ("1g", 1 << 30), ("1t", 1 << 40)] {
        let path = dir.path().join(name);
        make_image(&path, bytes, &Request::default());
        let out = fsck(&[path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
        assert!(text(&out).contains("clean"));
    }
    let tib = std::fs::metadata(dir.path().join("1t")).unwrap();
    let allocated = std::os::unix::fs::MetadataExt::blocks(&tib) * 512;
    assert!(
        allocated < 64 << 20,
        "1 TiB image allocates {allocated} bytes"
    );
}

/// Every metadata block of a fresh image and the structure name fsck must report for it.
fn metadata_blocks(plan: &cairn_mkfs::Plan) -> Vec<(u64, &'static str)> {
    let g = plan.geometry;
    let per_ag = [
        MetaKind::Superblock,
        MetaKind::Agf,
        MetaKind::Agi,
        MetaKind::Agfl,
        MetaKind::BnoBtree,
        MetaKind::CntBtree,
        MetaKind::InoBtree,
        MetaKind::FinoBtree,
    ];
    let mut blocks = Vec::new();
    for ag in 0..g.ag_count {
        for (index, kind) in per_ag.iter().enumerate().take(AG_FIRST_FREE as usize) {
            blocks.push((g.ag_start(ag) + index as u64, kind.name()));
        }
    }
    for index in 0..g.chunk_blocks() {
        blocks.push((u64::from(plan.root_chunk.0 + index), MetaKind::Inode.name()));
    }
    blocks
}

fn flip_byte(path: &std::path::Path, offset: u64) {
    let mut file = FsOpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut byte).unwrap();
    byte[0] ^= 0x20;
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&byte).unwrap();
}

// A byte flipped in any metadata block is found: exit 4 and the structure named, no panic.
#[test]
fn every_damaged_metadata_block_is_named() {
    for request in [
        Request::default(),
        Request {
            block_size: 512,
            sector_size: Some(512),
            ..Request::default()
        },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let plan = make_image(&path, 16 << 20, &request);
        let block_size = u64::from(plan.geometry.block_size);
        let blocks = metadata_blocks(&plan);
        assert!(
            blocks.len() >= 2 * AG_FIRST_FREE as usize,
            "{} blocks",
            blocks.len()
        );
        for (index, (block, name)) in blocks.iter().enumerate() {
            // Header, body and tail bytes in turn across the blocks.
            let within = [0, 5, 9, 20, 30, 44, 50, 100, block_size - 1][index % 9];
            let offset = block * block_size + within;
            flip_byte(&path, offset);
            let out = fsck(&[path.to_str().unwrap()]);
            flip_byte(&path, offset);
            let said = text(&out);
            assert_eq!(
                out.status.code(),
                Some(4),
                "block {block} byte {within}: {said}"
            );
            assert!(
                said.contains(name),
                "block {block} byte {within}: want {name} in\n{said}"
            );
            assert!(!said.contains("panicked"), "{said}");
        }
        let clean = fsck(&[path.to_str().unwrap()]);
        assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    }
}

// Wrong arguments exit 16; a missing device 8; something that is not cairn 4 with the reason.
#[test]
fn usage_and_operational_errors() {
    assert_eq!(fsck(&[]).status.code(), Some(16));
    assert_eq!(fsck(&["--bogus", "x"]).status.code(), Some(16));
    assert_eq!(fsck(&["-n", "-y", "x"]).status.code(), Some(16));
    assert_eq!(fsck(&["--help"]).status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let missing = fsck(&[dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(8), "{}", text(&missing));
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let out = fsck(&[zeros.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("bad magic"), "{}", text(&out));
}

// A device another process is writing is refused (exit 8), naming that process.
#[test]
fn device_held_by_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held");
    make_image(&path, 16 << 20, &Request::default());
    let holder = LockHolder::new(&path);
    let out = fsck(&[path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("pid {}", holder.pid())),
        "{}",
        text(&out)
    );
}
