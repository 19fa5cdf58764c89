//! AG selection for new inodes and new files' first data.
//!
//! New directories rotate over the AGs (a rotor), spreading unrelated trees apart. New files
//! go in their parent directory's AG. A new file's first data is placed near its inode but
//! offset by a slot derived from the inode number, so files created at once in one directory
//! by concurrent writers start in different regions and do not interleave their extents.

use std::sync::atomic::{AtomicU32, Ordering};

use cairn_format::{AgNumber, FsBlock, Geometry};

/// Regions of an AG that new files' first data is spread over.
pub const SPREAD_SLOTS: u32 = 16;

/// Chooses AGs and targets for new inodes and first data.
#[derive(Debug)]
pub struct AgSelector {
    geometry: Geometry,
    rotor: AtomicU32,
}

impl AgSelector {
    pub fn new(geometry: Geometry) -> Self {
        Self {
            geometry,
            rotor: AtomicU32::new(0),
        }
    }

    /// The AG of a new directory: the next AG of the rotor.
    pub fn directory_ag(&self) -> AgNumber {
        let turn = self.rotor.fetch_add(1, Ordering::Relaxed);
        AgNumber(turn % self.geometry.ag_count.max(1))
    }

    /// The AG of a new non-directory inode: its parent directory's.
    pub fn file_ag(&self, parent: FsBlock) -> AgNumber {
        let ag = self.geometry.ag_of(parent);
        AgNumber(ag.0.min(self.geometry.ag_count.saturating_sub(1)))
    }

    /// The target of a new file's first data: in the inode's AG, at the inode's block plus a
    /// slot of `ag_len / SPREAD_SLOTS` blocks chosen by hashing the inode number, wrapping
    /// within the AG.
    pub fn first_data_target(&self, inode_block: FsBlock, inode_number: u64) -> FsBlock {
        let ag = self.file_ag(inode_block);
        let ag_len = u64::from(self.geometry.ag_len(ag.0));
        let stride = (ag_len / u64::from(SPREAD_SLOTS)).max(1);
        let slot = spread_hash(inode_number) % u64::from(SPREAD_SLOTS);
        let within = u64::from(self.geometry.ag_block_of(inode_block).0);
        let offset = (within + slot * stride) % ag_len;
        FsBlock(self.geometry.ag_start(ag.0) + offset)
    }
}

/// A cheap mixing hash (splitmix64 finaliser) so consecutive inode numbers land far apart.
fn spread_hash(value: u64) -> u64 {
    let mut x = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the rotor cycles, files stay in the parent's AG, and sibling files spread.
    #[test]
    fn rotor_parent_and_spread() {
        let g = Geometry::new(4096, 512, 512, 4 * 8192, 8192, 8192 + 100, 64).unwrap();
        let select = AgSelector::new(g);
        let dirs: Vec<u32> = (0..5).map(|_| select.directory_ag().0).collect();
        assert_eq!(dirs, [0, 1, 2, 3, 0]);
        let parent = FsBlock(2 * 8192 + 40);
        assert_eq!(select.file_ag(parent), AgNumber(2));
        let targets: std::collections::BTreeSet<u64> = (100..116)
            .map(|ino| select.first_data_target(parent, ino).0)
            .collect();
        assert!(targets.len() >= 8, "{targets:?}");
        assert!(targets.iter().all(|t| g.ag_of(FsBlock(*t)) == AgNumber(2)));
    }
}
