//! Repair under random damage: random bytes of random metadata blocks of a small populated
//! image (AG headers, tree blocks, inode clusters, directory, xattr and symlink blocks) are
//! changed, then `-y` runs. It must never panic; it exits 1 (repaired) or 4 (left some),
//! or 0 when the damage hit only a stale block no structure uses (a freed tree block keeps
//! its magic and CRC, but nothing reads it). After 1, `-n` must exit 0; after 0 or 1,
//! cairn-fs must mount the image and read the root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::OnceLock;

use cairn_format::MetaKind;
use cairn_fs::{Credentials, FileKind, XattrFlags};
use cairn_fsck::cli::{self, Args, EXIT_CLEAN, EXIT_CORRECTED, EXIT_UNCORRECTED};
use clap::Parser;
use common::{Image, SECTOR};
use proptest::prelude::*;

/// The populated image with a file with data, an xattr block and a remote symlink, and the
/// blocks that hold metadata (by magic; the log is not metadata).
struct Base {
    bytes: Vec<u8>,
    block_size: usize,
    metadata: Vec<usize>,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let image: Image = common::populated();
        let bytes = std::fs::read(&image.path).unwrap();
        let device =
            std::sync::Arc::new(cairn_blockdev::MemDevice::from_image(bytes, SECTOR).unwrap());
        let fs =
            cairn_fs::Filesystem::mount(device.clone(), cairn_fs::MountOptions::default()).unwrap();
        let who = Credentials::root();
        let root = fs.root();
        let file = fs
            .create(image.a, b"data", FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode;
        fs.write(file, 0, &[3u8; 20_000]).unwrap();
        fs.setxattr(file, b"user.big", &[9u8; 1500], XattrFlags::Any, &who)
            .unwrap();
        fs.setxattr(root, b"user.small", b"v", XattrFlags::Any, &who)
            .unwrap();
        fs.symlink(root, b"link", &[b't'; 1000], &who).unwrap();
        fs.unmount().unwrap();
        let bytes = device.snapshot();
        let block_size = image.geometry.block_size as usize;
        let metadata = bytes
            .chunks_exact(block_size)
            .enumerate()
            .filter(|(_, block)| {
                let magic = u32::from_le_bytes(block[..4].try_into().unwrap());
                MetaKind::from_magic(magic).is_some()
            })
            .map(|(index, _)| index)
            .collect();
        Base {
            bytes,
            block_size,
            metadata,
        }
    })
}

fn fsck(flag: &str, path: &std::path::Path) -> u8 {
    let args = Args::try_parse_from(["fsck.cairn", flag, "-q", path.to_str().unwrap()]).unwrap();
    cli::run(&args)
}

/// One damage: (which metadata block, byte within it, value to XOR in).
type Damage = (prop::sample::Index, prop::sample::Index, u8);

fn damage() -> impl Strategy<Value = Damage> {
    (
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        1u8..=255,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn repair_survives_random_metadata_damage(damages in prop::collection::vec(damage(), 1..4)) {
        let base = base();
        let mut bytes = base.bytes.clone();
        for (block, byte, xor) in &damages {
            let at = block.get(&base.metadata) * base.block_size + byte.index(base.block_size);
            bytes[at] ^= xor;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, &bytes).unwrap();
        let repaired = fsck("-y", &path);
        prop_assert!(
            [EXIT_CLEAN, EXIT_CORRECTED, EXIT_UNCORRECTED].contains(&repaired),
            "-y exited {repaired}"
        );
        if repaired == EXIT_CORRECTED {
            prop_assert_eq!(fsck("-n", &path), EXIT_CLEAN, "-n after -y");
        }
        if repaired != EXIT_UNCORRECTED {
            common::mounts(&path);
        }
    }
}
