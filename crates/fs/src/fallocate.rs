//! `fallocate` (allocate, keep size, punch hole, zero range) and unmapping ranges through
//! extent-free intents.
//!
//! Unmapping runs in steps of two transactions: the first cuts a few extents out of the map
//! and logs an extent-free intent naming their blocks; the second frees the blocks and logs
//! the done item. Each transaction stays small (map changes in one, free-space trees in the
//! other), and a crash between them leaves blocks that belong to nothing but an intent, which
//! mount finishes (`Filesystem::finish_intents`).

use cairn_blockdev::AlignedBuf;
use cairn_journal::{Reservation, ShiftKind};

use crate::bmap::{FileMap, Mapping, Placement, commit_unmap, step_reservation};
use crate::data::check_data_file;
use crate::fs::Filesystem;
use crate::inode::{InodeData, now};
use crate::types::{Credentials, FallocateMode};
use crate::{FsError, perm};

impl Filesystem {
    /// Preallocates, punches or zeroes `len` bytes at `offset` of a regular file. The
    /// set-ID bits stay, as for a caller holding CAP_FSETID (see `fallocate_by`).
    pub fn fallocate(
        &self,
        inode: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Result<(), FsError> {
        self.fallocate_by(inode, offset, len, mode, &Credentials::root())
    }

    /// `fallocate` by `who`: callers other than root also lose the set-ID bits, as a
    /// write clears them.
    pub fn fallocate_by(
        &self,
        inode: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
        who: &Credentials,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= cairn_format::limits::FILE_BLOCK_MAX)
            .ok_or(FsError::InvalidArgument(
                "fallocate range empty or too large",
            ))?;
        let handle = self.live_inode(inode)?;
        let mut pages = handle.io.write();
        check_data_file(&handle.data.lock())?;
        crate::flags::check_fallocate(&handle.data.lock(), mode)?;
        // Cached data goes to the device first: every mode reads or changes the mapping.
        if !pages.is_empty() {
            self.write_back(&handle, &mut pages)?;
        }
        let block_size = u64::from(self.geometry.block_size);
        let keep_size = match mode {
            FallocateMode::CollapseRange => {
                return self.shift_range(&handle, (offset, len), ShiftKind::Collapse, who);
            }
            FallocateMode::InsertRange => {
                return self.shift_range(&handle, (offset, len), ShiftKind::Insert, who);
            }
            FallocateMode::Allocate { keep_size } => {
                let range = (offset / block_size, end.div_ceil(block_size));
                self.preallocate(inode, &handle.data, range)?;
                keep_size
            }
            FallocateMode::PunchHole => {
                let mut meta = handle.data.lock();
                self.zero_edges(inode, &mut meta, offset, end)?;
                let (first, last) = (offset.div_ceil(block_size), end / block_size);
                unmap_blocks(self, inode, &mut meta, first, last)?;
                true
            }
            FallocateMode::ZeroRange { keep_size } => {
                self.zero_range(inode, &handle.data, offset, end)?;
                keep_size
            }
        };
        let mut meta = handle.data.lock();
        let old_size = meta.core.size;
        if !keep_size && end > old_size {
            // Stale bytes past the old end must not come back with the new size.
            self.clear_past_eof(inode, &mut meta, old_size, end)?;
        }
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        if !keep_size {
            meta.core.size = meta.core.size.max(end);
            // The pages were written back above, under the I/O lock still held.
            meta.cover_written(u64::MAX);
        }
        let now = now();
        meta.core.mtime = now;
        meta.core.ctime = now;
        perm::clear_set_id_unless_root(&mut meta, who);
        Self::log_inode(&mut tx, inode, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        Ok(())
    }

    /// Zero range: partial edge blocks are zeroed on disk, whole blocks become unwritten
    /// (mapped ones flip state, holes get new unwritten blocks).
    fn zero_range(
        &self,
        inode: u64,
        lock: &cairn_lockrank::Mutex<InodeData>,
        offset: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let (first, last) = (offset.div_ceil(block_size), end / block_size);
        {
            let mut meta = lock.lock();
            self.zero_edges(inode, &mut meta, offset, end)?;
            if first < last {
                let mut tx = self.begin(self.write_reservation())?;
                let mut map = FileMap::load(self, &mut tx, inode, &meta)?;
                map.mark_unwritten(first, last);
                let stored = map.store(self, &mut tx, &mut meta);
                Self::log_inode(&mut tx, inode, &mut meta);
                self.commit(tx, &mut [&mut meta])?;
                stored?;
            }
        }
        let (head, tail) = (offset / block_size, end.div_ceil(block_size));
        self.preallocate(inode, lock, (head, tail))
    }

    /// Maps the holes of file blocks `first..last` unwritten, or fails with `NoSpace` holding
    /// no more blocks than before (`give_back.rs`): when the holes need more blocks than are
    /// free (after giving back other files' speculative preallocation) nothing is allocated,
    /// and an allocation that still finds the filesystem full half way is undone.
    fn preallocate(
        &self,
        inode: u64,
        lock: &cairn_lockrank::Mutex<InodeData>,
        (first, last): (u64, u64),
    ) -> Result<(), FsError> {
        let needed = self
            .holes_in(inode, &lock.lock(), &[(first, last)])?
            .blocks();
        if needed > self.statfs()?.blocks_available
            && (self.reclaim_speculative(inode)? == 0 || needed > self.statfs()?.blocks_available)
        {
            return Err(FsError::NoSpace);
        }
        self.allocate_or_give_back(inode, lock, &[(first, last)], || {
            self.allocate_range(inode, lock, first, last, Placement::near(true))
        })
    }

    /// Zeroes the bytes of `offset..end` that lie in partial blocks at either end, where
    /// those blocks hold written data (holes and unwritten blocks read as zeros already).
    fn zero_edges(
        &self,
        inode: u64,
        meta: &mut InodeData,
        offset: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let head = (offset / block_size, offset % block_size);
        let tail = (end / block_size, end % block_size);
        let mut edges = Vec::new();
        if head.0 == tail.0 {
            if head.1 != 0 || tail.1 != 0 {
                edges.push((head.0, head.1, tail.1));
            }
        } else {
            if head.1 != 0 {
                edges.push((head.0, head.1, block_size));
            }
            if tail.1 != 0 {
                edges.push((tail.0, 0, tail.1));
            }
        }
        for &(block, _, _) in &edges {
            // Zeroed in place: a shared block is copied first.
            self.unshare(inode, meta, (block, block + 1))?;
        }
        let map = FileMap::read(self, inode, meta)?;
        for (block, from, to) in edges {
            let Mapping::Mapped(extent) = map.lookup(block) else {
                continue;
            };
            if extent.unwritten {
                continue;
            }
            let physical = extent.fs_block.0 + (block - extent.file_block);
            let mut buf = AlignedBuf::zeroed(block_size as usize);
            self.device.read_at(physical * block_size, &mut buf)?;
            buf[from as usize..to as usize].fill(0);
            self.device.write_at(physical * block_size, &buf)?;
        }
        Ok(())
    }
}

/// Unmaps and frees file blocks `start..end` of inode `number` (held locked by the caller),
/// from the end backwards, in intent/done transaction pairs (see the module documentation).
pub(crate) fn unmap_blocks(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    start: u64,
    end: u64,
) -> Result<(), FsError> {
    let mut end = end;
    while start < end {
        let mut tx = fs.begin(step_reservation(fs))?;
        let mut map = FileMap::load(fs, &mut tx, number, data)?;
        let (step_end, removed) = map.cut_step(start, end);
        if removed.is_empty() {
            tx.tx.cancel()?;
            return Ok(());
        }
        commit_unmap(fs, tx, number, data, &mut map, &removed)?;
        end = step_end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_blockdev::{BlockDevice, MemDevice};
    use cairn_format::inode::FileType;

    use super::*;
    use crate::types::{Credentials, FileKind, MountOptions};

    fn device() -> Arc<MemDevice> {
        Arc::new(crate::test_device::formatted(64 << 20, [7; 16]))
    }

    // Crashes after an unmap's intent transaction is durable but before its free: mount
    // must finish the intent, so the free space comes back and nothing is lost.
    #[test]
    fn mount_finishes_an_unmap_intent() {
        let device = device();
        let dyn_device: Arc<dyn BlockDevice> = device.clone();
        let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
        let who = Credentials::root();
        let file = fs
            .create(fs.root(), b"f", FileKind::Regular, 0o644, 0, &who)
            .unwrap();
        fs.write(file.inode, 0, &vec![1u8; 64 << 10]).unwrap();
        fs.sync().unwrap();
        let free_before = fs.statfs().unwrap().blocks_free;
        let handle = fs.live_inode(file.inode).unwrap();
        {
            let mut data = handle.data.lock();
            assert_eq!(data.file_type(), Some(FileType::Regular));
            let mut tx = fs.begin(step_reservation(&fs)).unwrap();
            let mut map = FileMap::load(&fs, &mut tx, file.inode, &data).unwrap();
            let (_, removed) = map.cut_step(0, u64::MAX);
            tx.tx.log_free_intent(&crate::bmap::free_extents(&removed));
            map.store(&fs, &mut tx, &mut data).unwrap();
            data.core.block_count = 0;
            Filesystem::log_inode(&mut tx, file.inode, &mut data);
            fs.commit(tx, &mut [&mut data]).unwrap();
        }
        fs.sync().unwrap();
        let image = device.durable_image();
        drop(handle);
        drop(fs);
        let crashed: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_image(image, 4096).unwrap());
        let fs = Filesystem::mount(crashed, MountOptions::default()).unwrap();
        assert_eq!(fs.recovery_report().unfinished_intents.len(), 1);
        assert_eq!(fs.statfs().unwrap().blocks_free, free_before + 16);
        assert_eq!(fs.read(file.inode, 0, 100).unwrap(), vec![0u8; 100]);
        fs.unmount().unwrap();
    }
}
