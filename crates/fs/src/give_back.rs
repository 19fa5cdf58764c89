//! Giving back what a failed allocation took: a `fallocate`, a write or a writeback maps the
//! holes of a range in several transactions, and when a later step finds the filesystem full
//! the call fails. XFS leaves the file holding no more blocks than before such a call; so does
//! cairn: the holes are noted before the allocation, and on failure whatever is mapped in them
//! then (only this call can have mapped it: the caller holds the inode's I/O lock
//! exclusively) is unmapped again through the usual free intents.
//!
//! Before, a 2 GiB `fallocate` that failed with `ENOSPC` on a 4 GiB filesystem with 3 GiB in
//! use left the file holding 891 MiB and the filesystem full (issue 32).

use cairn_lockrank::Mutex;

use crate::FsError;
use crate::bmap::FileMap;
use crate::fs::Filesystem;
use crate::inode::InodeData;

/// File block ranges (`first..last`) that were holes before an allocation.
#[derive(Debug, Default)]
pub(crate) struct Holes(Vec<(u64, u64)>);

impl Holes {
    /// Blocks the holes span.
    pub(crate) fn blocks(&self) -> u64 {
        self.0.iter().map(|(first, last)| last - first).sum()
    }

    /// The parts of the holes from file block `block` on.
    pub(crate) fn past(&self, block: u64) -> Holes {
        let clipped = self.0.iter().filter(|&&(_, last)| last > block);
        Holes(
            clipped
                .map(|&(first, last)| (first.max(block), last))
                .collect(),
        )
    }
}

impl Filesystem {
    /// The holes of file blocks `ranges` (each `first..last`) of inode `number` now.
    pub(crate) fn holes_in(
        &self,
        number: u64,
        data: &InodeData,
        ranges: &[(u64, u64)],
    ) -> Result<Holes, FsError> {
        let mut holes = Vec::new();
        for &(first, last) in ranges.iter().filter(|(first, last)| first < last) {
            let map = FileMap::read_around(self, number, data, (first, last))?;
            let mut block = first;
            for extent in map.extents() {
                if extent.file_end() <= block || extent.file_block >= last {
                    continue;
                }
                if extent.file_block > block {
                    holes.push((block, extent.file_block));
                }
                block = extent.file_end();
            }
            if block < last {
                holes.push((block, last));
            }
        }
        Ok(Holes(holes))
    }

    /// Runs `allocate`, which maps blocks in `ranges` of inode `number`; if it fails, unmaps
    /// what it mapped in the holes those ranges had, and returns its error. The caller holds
    /// the inode's I/O lock exclusively.
    pub(crate) fn allocate_or_give_back(
        &self,
        number: u64,
        lock: &Mutex<InodeData>,
        ranges: &[(u64, u64)],
        allocate: impl FnOnce() -> Result<(), FsError>,
    ) -> Result<(), FsError> {
        let holes = self.holes_in(number, &lock.lock(), ranges)?;
        let Err(error) = allocate() else {
            return Ok(());
        };
        self.give_back_or_warn(number, lock, &holes);
        Err(error)
    }

    /// `give_back`, logging a failure instead of returning it (the caller returns the
    /// error that made it give back).
    pub(crate) fn give_back_or_warn(&self, number: u64, lock: &Mutex<InodeData>, holes: &Holes) {
        if let Err(undo) = self.give_back(number, lock, holes) {
            // The blocks stay mapped past or inside the file, unwritten: fsck counts them,
            // and a truncate or removal frees them.
            tracing::warn!(inode = number, %undo, "giving back a failed allocation failed");
        }
    }

    /// Unmaps whatever is mapped in `holes` (a few extents a step, through free intents).
    pub(crate) fn give_back(
        &self,
        number: u64,
        lock: &Mutex<InodeData>,
        holes: &Holes,
    ) -> Result<(), FsError> {
        let mut data = lock.lock();
        for &(first, last) in holes.0.iter().rev() {
            crate::fallocate::unmap_blocks(self, number, &mut data, first, last)?;
        }
        Ok(())
    }
}
