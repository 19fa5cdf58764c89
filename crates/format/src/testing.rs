//! Shared fixtures for the unit tests.

use crate::geometry::Geometry;

pub const UUID: [u8; 16] = *b"cairn-test-uuid!";

/// 1 GiB of 4 KiB blocks in four AGs of 65536 blocks, 512-byte inodes, log in AG 0.
pub fn sample_geometry() -> Geometry {
    match Geometry::new(4096, 512, 512, 262_144, 65_536, 16, 2048) {
        Ok(g) => g,
        Err(e) => panic!("sample geometry refused: {e:?}"),
    }
}
