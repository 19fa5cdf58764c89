//! Growing the filesystem onto a larger device (the offline form, `cairn grow IMAGE SIZE`):
//! the last AG is extended to the full AG size (or to the new end) and new AGs are added.
//!
//! Crash safety, as xfs_growfs does it: the new AGs' headers are written straight to the
//! device, past the old end, and flushed before anything refers to them; then one
//! transaction extends the last AG (its AGF and AGI lengths, the new range freed into its
//! trees) and rewrites every superblock copy of the old AGs and the primary with the new
//! geometry and counters. A crash before that checkpoint is durable leaves the old size
//! (the new headers lie in space the filesystem does not own); after, recovery replays
//! it and the mount reads the new geometry (`Filesystem::mount` reads the superblock
//! again after a recovery that changed it). All copies change in the one transaction, so
//! fsck's vote of the copies never sees a majority of old ones.

use cairn_bufcache::{BufKey, HeaderOps, ReadSpec};
use cairn_format::limits::{AG_BLOCKS_MIN, AG_SUPERBLOCK, BTREE_LEVELS_MAX};
use cairn_format::{AgBlock, FsBlock, Geometry, MetaKind, OnDisk, Superblock};
use cairn_journal::Reservation;
use cairn_mkfs::Plan;

use crate::FsError;
use crate::fs::Filesystem;
use crate::glue::JournalLog;

static SUPERBLOCK_OPS: HeaderOps = HeaderOps::new(MetaKind::Superblock);

/// An inode the kernel still references (lookups it may forget, files it has open): what a
/// remount must carry over for the kernel's view to stay valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldInode {
    pub inode: u64,
    pub lookups: u64,
    pub opens: u64,
    /// Whether it still has a name (an unlinked one sits on the unlinked list, which a
    /// mount empties).
    pub linked: bool,
}

/// What a grow did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowReport {
    pub old_blocks: u64,
    pub new_blocks: u64,
    pub old_ags: u32,
    pub new_ags: u32,
}

/// The geometry of `old` grown to `blocks` blocks; a last AG shorter than `AG_BLOCKS_MIN`
/// is left out (its blocks stay unused), as mkfs does.
pub fn grown_geometry(old: &Geometry, blocks: u64) -> Result<Geometry, FsError> {
    let ag_blocks = u64::from(old.ag_blocks);
    let tail = blocks % ag_blocks;
    let blocks = match tail != 0 && tail < u64::from(AG_BLOCKS_MIN) {
        true => blocks - tail,
        false => blocks,
    };
    if blocks <= old.block_count {
        return Err(FsError::InvalidArgument(
            "the new size is not larger than the filesystem",
        ));
    }
    Geometry::new(
        old.block_size,
        old.sector_size,
        old.inode_size,
        blocks,
        old.ag_blocks,
        old.log_start,
        old.log_blocks,
    )
    .map_err(|(_, _, why)| FsError::InvalidArgument(why))
}

impl Filesystem {
    /// The inodes the kernel references now (see `HeldInode`).
    pub fn held_inodes(&self) -> Vec<HeldInode> {
        self.inodes
            .all()
            .into_iter()
            .filter_map(|inode| {
                let data = inode.data.lock();
                data.is_referenced().then(|| HeldInode {
                    inode: inode.number,
                    lookups: data.lookups,
                    opens: data.opens,
                    linked: data.core.nlink > 0,
                })
            })
            .collect()
    }

    /// After a remount: takes over the references of `held` (from `held_inodes` of the
    /// filesystem before), so the kernel's later forgets and releases balance.
    pub fn hold_inodes(&self, held: &[HeldInode]) -> Result<(), FsError> {
        for one in held {
            let inode = self.inode(one.inode)?;
            let mut data = inode.data.lock();
            data.lookups += one.lookups;
            data.opens += one.opens;
        }
        Ok(())
    }

    /// The device the filesystem lives on (to mount it again after a grow).
    pub fn device(&self) -> std::sync::Arc<dyn cairn_blockdev::BlockDevice> {
        std::sync::Arc::clone(&self.device)
    }

    /// The options it was mounted with.
    pub fn options(&self) -> &crate::MountOptions {
        &self.options
    }

    /// What growing to `blocks` blocks (at most the device's size) would do, or why it
    /// cannot; changes nothing.
    pub fn plan_grow(&self, blocks: u64) -> Result<GrowReport, FsError> {
        self.check_writable()?;
        let old = self.geometry;
        let device_blocks = self.device.size_bytes() / u64::from(old.block_size);
        let new = grown_geometry(&old, blocks.min(device_blocks))?;
        Ok(GrowReport {
            old_blocks: old.block_count,
            new_blocks: new.block_count,
            old_ags: old.ag_count,
            new_ags: new.ag_count,
        })
    }

    /// Grows the filesystem to `blocks` blocks (at most the device's size), then unmounts
    /// it cleanly. Nothing else may use the filesystem meanwhile. Cached data is written
    /// back first; a failed writeback has already dropped its data and logged the loss, so
    /// the grow goes on.
    pub fn grow(self, blocks: u64) -> Result<GrowReport, FsError> {
        let _ = self.write_back_all();
        let report = self.plan_grow(blocks)?;
        let old = self.geometry;
        let new = grown_geometry(&old, report.new_blocks)?;
        let plan = Plan {
            geometry: new,
            label: self.superblock.label,
            log_ag: old.ag_of(FsBlock(old.log_start)).0,
            root_chunk: AgBlock(0),
            root_inode: cairn_format::InodeNumber(self.superblock.root_inode),
            // New AGs start with no refcount tree (all-zero AGF fields) either way.
            features_incompat: self.superblock.features_incompat,
        };
        let superblock = self.grown_superblock(&new)?;
        for ag in old.ag_count..new.ag_count {
            let run = cairn_mkfs::build::grown_ag(&plan, &superblock, ag).map_err(|error| {
                FsError::Io {
                    what: "building the new AG headers",
                    source: Box::new(error),
                }
            })?;
            self.device
                .write_at(new.byte_offset(run.start), &run.data)?;
        }
        // The new headers are on disk before the transaction that makes them part of the
        // filesystem can be.
        self.device.flush()?;
        self.commit_grow(&new, &superblock)?;
        self.finish_unmount()?;
        Ok(report)
    }

    /// The superblock of the grown filesystem: the new geometry, free blocks counted from
    /// the AG headers plus what the grow adds, inode counts as they are.
    fn grown_superblock(&self, new: &Geometry) -> Result<Superblock, FsError> {
        let old = &self.geometry;
        let last = old.ag_count - 1;
        let mut added = u64::from(new.ag_len(last) - old.ag_len(last));
        for ag in old.ag_count..new.ag_count {
            added += u64::from(new.ag_len(ag) - Plan::reserved_end());
        }
        let mut superblock = self.counted_superblock()?;
        superblock.geometry = *new;
        superblock.free_blocks += added;
        Ok(superblock)
    }

    /// The one grow transaction: the last AG extended, every old superblock copy and the
    /// primary rewritten; forced to the log.
    fn commit_grow(&self, new: &Geometry, superblock: &Superblock) -> Result<(), FsError> {
        let old = &self.geometry;
        let paths = 3 + 2 * (2 * BTREE_LEVELS_MAX + 2);
        let headers = Reservation::for_items(old, paths, old.block_size, 0, 0);
        let copies = Reservation::for_items(old, old.ag_count, Superblock::SIZE as u32, 0, 0);
        let mut tx = self.begin(Reservation::new(headers.bytes + copies.bytes))?;
        let last = old.ag_count - 1;
        if new.ag_len(last) > old.ag_len(last) {
            // The AGI before the AGF (every AGI before every AGF, docs/fs.md).
            let mut agi = crate::ialloc::read_agi(self, &mut tx, last)?;
            agi.ag_length = new.ag_len(last);
            crate::ialloc::write_agi(self, &mut tx, &agi)?;
            let log = JournalLog(&self.journal);
            self.alloc.grow_ag(&mut tx, &log, last, new.ag_len(last))?;
        }
        for ag in 0..old.ag_count {
            let block = old.ag_start(ag) + u64::from(AG_SUPERBLOCK);
            let spec = ReadSpec::new(&SUPERBLOCK_OPS, self.uuid).with_owner(u64::from(ag));
            let guard = tx.tx.get_buf(BufKey::single(block), &spec)?;
            guard.write(0, &superblock.copy_for_ag(ag).to_bytes())?;
        }
        let sequence = tx.tx.commit()?;
        self.journal.force(sequence)?;
        Ok(())
    }
}
