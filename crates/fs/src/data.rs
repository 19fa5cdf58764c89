//! File data I/O straight to the device (never through the buffer cache): reads that return
//! zeros for holes and unwritten extents, and writes that allocate new space as unwritten,
//! write the data, then convert it to written in a second transaction.
//!
//! Crash argument (also in docs/fs.md): the conversion commits only after the data writes
//! returned, and the journal flushes the device before the commit record of any checkpoint
//! holding a transaction that orders data (all but overwrites in place,
//! `overwrite_orders_no_data`), so a checkpoint that makes the blocks readable always
//! follows the data on stable storage.
//! Before that checkpoint the blocks are unwritten (or unmapped) and read as zeros, so a
//! crash never exposes another file's old data.

use cairn_blockdev::AlignedBuf;
use cairn_extcache::InodeExtents;
use cairn_format::inode::ForkFormat;
use cairn_journal::Reservation;

use crate::bmap::{self, FileMap, Mapping, Placement};
use crate::cow::{Overwrite, Stopped};
use crate::fs::Filesystem;
use crate::inode::{Inode, InodeData, now};
use crate::iobuf::{self, ReadData};
use crate::prealloc::WritePlan;
use crate::types::{Credentials, WriteOrigin};
use crate::{FsError, perm};

/// Largest single read or write, in bytes.
pub(crate) const IO_BYTES_MAX: u64 = 64 << 20;

/// Writes this large go to the device even with write-behind on: the kernel sends a
/// streaming writer's data in requests this large, already merged and sorted, and copying
/// them through 4 KiB pages halved sequential throughput (1,108 to 574 MiB/s).
const WRITE_THROUGH_BYTES: usize = 256 << 10;

/// Refuses directories and forks that hold no extent map.
pub(crate) fn check_data_file(data: &InodeData) -> Result<(), FsError> {
    if data.is_dir() {
        return Err(FsError::IsDirectory);
    }
    match data.core.data_format {
        ForkFormat::Extents | ForkFormat::Btree => Ok(()),
        _ => Err(FsError::InvalidArgument("not a regular file")),
    }
}

impl Filesystem {
    /// Reads up to `len` bytes at `offset`; short at end of file.
    pub fn read(&self, inode: u64, offset: u64, len: u32) -> Result<Vec<u8>, FsError> {
        Ok(self.read_data(inode, offset, len)?.to_vec())
    }

    /// `read` without the copy: the bytes stay in the device buffer they were read into
    /// (this thread's spare, see `iobuf`), which is what a FUSE reply sends from.
    pub fn read_data(&self, inode: u64, offset: u64, len: u32) -> Result<ReadData, FsError> {
        let handle = self.live_inode(inode)?;
        let read = self.read_inode_data(&handle, offset, len);
        if read.is_ok() {
            self.accessed(inode, &handle);
        }
        read
    }

    /// `read_data` that leaves the access time alone (a check of what is there).
    pub(crate) fn read_unaccessed(
        &self,
        inode: u64,
        offset: u64,
        len: u32,
    ) -> Result<ReadData, FsError> {
        let handle = self.live_inode(inode)?;
        self.read_inode_data(&handle, offset, len)
    }

    fn read_inode_data(&self, handle: &Inode, offset: u64, len: u32) -> Result<ReadData, FsError> {
        let inode = handle.number;
        let pages = handle.io.read();
        let (size, generation) = {
            let data = handle.data.lock();
            check_data_file(&data)?;
            (data.core.size, data.core.generation)
        };
        let end = size.min(offset.saturating_add(u64::from(len)));
        if offset >= end {
            return Ok(ReadData::empty());
        }
        Self::count(&self.counters.reads, 1);
        Self::count(&self.counters.read_bytes, end - offset);
        let block_size = u64::from(self.geometry.block_size);
        let first = offset / block_size;
        let mut buf = iobuf::take(((end.div_ceil(block_size) - first) * block_size) as usize);
        let extents = self.data_cache.inode(inode, generation);
        if let Err(error) = self.read_blocks(handle, &extents, first, &mut buf) {
            iobuf::give_back(buf);
            return Err(error);
        }
        pages.overlay(first, &mut buf, block_size as usize);
        let start = (offset - first * block_size) as usize;
        Ok(ReadData::new(buf, start, (end - offset) as usize))
    }

    /// Fills `buf` with the file's blocks from `first` on: one device read per mapped run,
    /// straight into its place in `buf`, zeros for holes and unwritten extents (`buf` may
    /// hold an earlier transfer's bytes, so every byte is written).
    pub(crate) fn read_blocks(
        &self,
        handle: &Inode,
        extents: &InodeExtents,
        first: u64,
        buf: &mut [u8],
    ) -> Result<(), FsError> {
        for (offset, range) in self.plan_blocks(handle, extents, first, buf)? {
            self.device.read_into(offset, &mut buf[range])?;
        }
        Ok(())
    }

    /// Fills `buf`'s holes and unwritten blocks (from file block `first` on) with zeros and
    /// returns the device reads that fill the rest, one per mapped run.
    pub(crate) fn plan_blocks(
        &self,
        file: &Inode,
        extents: &InodeExtents,
        first: u64,
        buf: &mut [u8],
    ) -> Result<Vec<(u64, std::ops::Range<usize>)>, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let last = first + buf.len() as u64 / block_size;
        let mut parts = Vec::new();
        let mut block = first;
        while block < last {
            let (run_end, physical) = match self.map_block(file, extents, block)? {
                Mapping::Hole { length } => (block.saturating_add(length).min(last), None),
                Mapping::Mapped(run) if run.unwritten => (run.file_end().min(last), None),
                Mapping::Mapped(run) => (
                    run.file_end().min(last),
                    Some(run.fs_block.0 + (block - run.file_block)),
                ),
            };
            let range =
                ((block - first) * block_size) as usize..((run_end - first) * block_size) as usize;
            match physical {
                Some(physical) => parts.push((physical * block_size, range)),
                None => buf[range].fill(0),
            }
            block = run_end;
        }
        Ok(parts)
    }

    /// Writes `data` at `offset`, extending the file as needed; returns the bytes written.
    /// The set-ID bits stay, as for a writer holding CAP_FSETID. With write-behind on
    /// (`MountOptions::data_cache`) the data is cached and written back later.
    pub fn write(&self, inode: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        self.write_checked(inode, offset, data, &WriteOrigin::default(), false)
    }

    /// `write` for a file opened with `O_DIRECT`: the data reaches the device before this
    /// returns, even with write-behind on (the inode's cached pages are written back
    /// first). `writer`, if given, is a process without CAP_FSETID (as for
    /// `write_clearing_set_id`).
    pub fn write_direct(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        writer: Option<&Credentials>,
    ) -> Result<u32, FsError> {
        let origin = WriteOrigin {
            clears_set_id: writer,
            ..WriteOrigin::default()
        };
        self.write_checked(inode, offset, data, &origin, true)
    }

    /// `write` by a process without CAP_FSETID: also clears setuid, and setgid where
    /// Linux does (group-executable, or `writer` outside the file's group), in the same
    /// transaction as the write.
    pub fn write_clearing_set_id(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        writer: &Credentials,
    ) -> Result<u32, FsError> {
        let origin = WriteOrigin {
            clears_set_id: Some(writer),
            ..WriteOrigin::default()
        };
        self.write_checked(inode, offset, data, &origin, false)
    }

    /// The write itself, after `write_checked` applied the inode flags' rules.
    pub(crate) fn write_as(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        clear_set_id_for: Option<&Credentials>,
        direct: bool,
    ) -> Result<u32, FsError> {
        self.check_writable()?;
        if data.len() as u64 > IO_BYTES_MAX {
            return Err(FsError::InvalidArgument("write larger than the limit"));
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= cairn_format::limits::FILE_BLOCK_MAX)
            .ok_or(FsError::InvalidArgument("write past the largest file"))?;
        if self.write_behind.is_on() && !direct && data.len() < WRITE_THROUGH_BYTES {
            return self.write_cached(inode, offset, data, clear_set_id_for);
        }
        let handle = self.live_inode(inode)?;
        let mut pages = handle.io.write();
        check_data_file(&handle.data.lock())?;
        if !pages.is_empty() {
            self.write_back(&handle, &mut pages)?;
        }
        if data.is_empty() {
            return Ok(0);
        }
        Self::count(&self.counters.writes, 1);
        {
            let mut meta = handle.data.lock();
            let old_size = meta.core.size;
            if offset > old_size {
                self.clear_past_eof(inode, &mut meta, old_size, offset)?;
            }
        }
        let block_size = u64::from(self.geometry.block_size);
        let (first, last) = (offset / block_size, end.div_ceil(block_size));
        let plan = self.plan_write(inode, &handle.data.lock(), first, last, end)?;
        // A file that may share blocks copies them after its holes are mapped; when the
        // copy finds no space, what the holes took goes back, as for a failed allocation.
        let holes = match plan.needs_blocks && crate::reflink::may_share(&handle.data.lock()) {
            true => Some(self.holes_in(inode, &handle.data.lock(), &[(first, last)])?),
            false => None,
        };
        match plan.needs_blocks {
            true => self.allocate_planned(inode, &handle, &plan, last)?,
            false => self.note_preallocation(inode, &plan, 0),
        }
        let new = Overwrite { offset, data };
        let (filled, end) = match self.unshare_for_write(inode, &handle, (first, last), Some(new)) {
            Ok(filled) => (filled, end),
            // Shared blocks from `at` on have no copy: the write ends before them (its
            // bytes may be in copies before), or fails if that leaves nothing.
            Err(Stopped { error, at }) => {
                let short = (at * block_size).min(end).max(offset);
                let unused = holes.map(|holes| holes.past(short.div_ceil(block_size)));
                if let Some(unused) = unused.filter(|holes| holes.blocks() > 0) {
                    self.give_back_or_warn(inode, &handle.data, &unused);
                }
                match short > offset {
                    true => (0, short),
                    false => return Err(error),
                }
            }
        };
        let (data, last) = (&data[..(end - offset) as usize], end.div_ceil(block_size));
        // A write of whole blocks that were all shared is on the device already, in the
        // blocks of its copy-on-write.
        let aligned = offset.is_multiple_of(block_size) && end.is_multiple_of(block_size);
        if !(aligned && filled == last - first) {
            let generation = handle.data.lock().core.generation;
            let extents = self.data_cache.inode(inode, generation);
            self.write_blocks(&handle, &extents, offset, data)?;
        }
        self.commit_written(&handle, (first, last), end, clear_set_id_for)?;
        Self::count(&self.counters.write_bytes, data.len() as u64);
        Ok(data.len() as u32)
    }

    /// Copies the shared blocks of file blocks `first..last` before a write (of `new`, if
    /// given) lands on them (`unshare_for`); a full filesystem first gives back other files'
    /// speculative blocks. Returns how many blocks got the write's bytes (fewer when the
    /// copy was retried: the write then writes them again).
    pub(crate) fn unshare_for_write(
        &self,
        inode: u64,
        handle: &Inode,
        range: (u64, u64),
        new: Option<Overwrite<'_>>,
    ) -> Result<u64, Stopped> {
        let copied = self.unshare_for(inode, &mut handle.data.lock(), range, new);
        match copied {
            Err(Stopped {
                error: FsError::NoSpace,
                at,
            }) => {
                let reclaimed = self
                    .reclaim_speculative(inode)
                    .map_err(|error| Stopped { error, at })?;
                match reclaimed > 0 {
                    true => self
                        .unshare_for(inode, &mut handle.data.lock(), range, new)
                        .map_err(|stopped| Stopped {
                            at: stopped.at.max(at),
                            ..stopped
                        }),
                    false => Err(Stopped {
                        error: FsError::NoSpace,
                        at,
                    }),
                }
            }
            other => other,
        }
    }

    /// `allocate_for_write`, then records the speculative blocks it mapped.
    pub(crate) fn allocate_planned(
        &self,
        inode: u64,
        handle: &Inode,
        plan: &WritePlan,
        last: u64,
    ) -> Result<(), FsError> {
        let blocks_before = handle.data.lock().core.block_count;
        self.allocate_for_write(inode, handle, plan, last)?;
        let mapped = handle
            .data
            .lock()
            .core
            .block_count
            .saturating_sub(blocks_before);
        self.note_preallocation(inode, plan, mapped);
        Ok(())
    }

    /// Maps the holes among the blocks `plan` covers for a write ending at file block
    /// `last`: what the write needs (giving back speculative blocks if the filesystem is
    /// full), then the speculative rest, which a full filesystem may refuse.
    fn allocate_for_write(
        &self,
        inode: u64,
        handle: &Inode,
        plan: &WritePlan,
        last: u64,
    ) -> Result<(), FsError> {
        let needed_end = last.max(
            plan.last
                .min(last.next_multiple_of(plan.alignment_blocks())),
        );
        // A write that finds the filesystem full half way gives back what it mapped.
        let needed = &[(plan.first, needed_end)];
        self.allocate_or_give_back(inode, &handle.data, needed, || {
            let allocate =
                || self.allocate_range(inode, &handle.data, plan.first, needed_end, plan.placement);
            match allocate() {
                Err(FsError::NoSpace) if self.reclaim_speculative(inode)? > 0 => allocate(),
                other => other,
            }
        })?;
        if plan.last > needed_end {
            match self.allocate_range(inode, &handle.data, needed_end, plan.last, plan.placement) {
                Ok(()) | Err(FsError::NoSpace) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// The second transaction of a write: file blocks `blocks` become written, the size
    /// grows to `end`, the times move, and the set-ID bits go if `clear_set_id_for` says so.
    fn commit_written(
        &self,
        handle: &Inode,
        (first, last): (u64, u64),
        end: u64,
        clear_set_id_for: Option<&Credentials>,
    ) -> Result<(), FsError> {
        let inode = handle.number;
        let mut meta = handle.data.lock();
        let mut tx = self.begin(self.write_reservation())?;
        let mut map = FileMap::load_around(self, &mut tx, inode, &meta, &[(first, last)])?;
        map.mark_written(first, last);
        let map_changed = map.is_changed();
        let stored = map.store(self, &mut tx, &mut meta);
        let now = now();
        meta.core.mtime = now;
        meta.core.ctime = now;
        meta.core.size = meta.core.size.max(end);
        // The caller wrote the inode's cached pages back and holds its I/O lock: every
        // byte of the file is on the device or in a hole.
        let logged_size = meta.disk_size;
        meta.cover_written(u64::MAX);
        let size_grew = meta.disk_size > logged_size;
        let cleared = clear_set_id_for.is_some_and(|writer| perm::clear_set_id(&mut meta, writer));
        let overwrite = Self::overwrite_orders_no_data(&mut tx, map_changed, size_grew);
        Self::log_inode(&mut tx, inode, &mut meta);
        self.commit_inode(tx, &mut meta, overwrite && !cleared && stored.is_ok())?;
        stored
    }

    /// The mapping of file block `block` through the extent cache (the caller holds the I/O
    /// lock, so the map cannot change while a miss reads and caches it).
    pub(crate) fn map_block(
        &self,
        handle: &Inode,
        extents: &InodeExtents,
        block: u64,
    ) -> Result<Mapping, FsError> {
        crate::extents::lookup(extents, block, || {
            let data = handle.data.lock();
            Ok(FileMap::read(self, handle.number, &data)?
                .extents()
                .to_vec())
        })
    }

    /// Reservation of one allocation or conversion step (see `bmap::step_reservation`).
    pub(crate) fn write_reservation(&self) -> Reservation {
        bmap::step_reservation(self)
    }

    /// Maps every hole in file blocks `first..last` as `placement` says, a few extents per
    /// transaction.
    pub(crate) fn allocate_range(
        &self,
        inode: u64,
        lock: &cairn_lockrank::Mutex<InodeData>,
        first: u64,
        last: u64,
        placement: Placement,
    ) -> Result<(), FsError> {
        let mut block = first;
        while block < last {
            let mut meta = lock.lock();
            let mut tx = self.begin(self.write_reservation())?;
            let mut map = FileMap::load_around(self, &mut tx, inode, &meta, &[(block, last)])?;
            let step = map.map_range(self, &mut tx, &mut meta, block, last, placement);
            let stored = map.store(self, &mut tx, &mut meta);
            Self::log_inode(&mut tx, inode, &mut meta);
            self.commit(tx, &mut [&mut meta])?;
            stored?;
            block = step?;
        }
        Ok(())
    }

    /// Writes `data` at `offset` into mapped blocks; partial blocks of written extents are
    /// read first, those of unwritten ones start from zeros.
    fn write_blocks(
        &self,
        handle: &Inode,
        extents: &InodeExtents,
        offset: u64,
        data: &[u8],
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let end = offset + data.len() as u64;
        let mut block = offset / block_size;
        while block < end.div_ceil(block_size) {
            let Mapping::Mapped(run) = self.map_block(handle, extents, block)? else {
                return Err(FsError::corrupt(
                    "file mapping",
                    block,
                    "hole after allocation",
                ));
            };
            let run_end = run.file_end().min(end.div_ceil(block_size));
            let physical = run.fs_block.0 + (block - run.file_block);
            let from = (block * block_size).max(offset);
            let to = (run_end * block_size).min(end);
            let (at, src) = (
                (from - block * block_size) as usize,
                (from - offset) as usize,
            );
            let part = &data[src..src + (to - from) as usize];
            if at == 0 && to.is_multiple_of(block_size) {
                // Whole blocks: straight from the caller's memory (FUSE write data is
                // page-aligned, see vendor/fuser/CAIRN-PATCH.md), copied only if unaligned.
                self.device.write_from(physical * block_size, part)?;
                block = run_end;
                continue;
            }
            let mut buf = iobuf::take(((run_end - block) * block_size) as usize);
            let written = self.fill_run(&mut buf, (physical, run.unwritten), at, part);
            let written = written.and_then(|()| {
                self.device
                    .write_at(physical * block_size, &buf)
                    .map_err(FsError::from)
            });
            iobuf::give_back(buf);
            written?;
            block = run_end;
        }
        Ok(())
    }

    /// Fills `buf`, blocks of an extent from device block `physical` on, with `data` at byte
    /// `at` of `buf`; the rest of a partly covered first or last block is read from the
    /// device (a written extent) or zeroed (unwritten). `buf` may hold an earlier transfer's
    /// bytes, so every byte of it is written.
    fn fill_run(
        &self,
        buf: &mut [u8],
        (physical, unwritten): (u64, bool),
        at: usize,
        data: &[u8],
    ) -> Result<(), FsError> {
        let block_size = self.geometry.block_size as usize;
        let blocks = buf.len() / block_size;
        let covered = at + data.len();
        let head = (at > 0 || covered < block_size).then_some(0);
        let tail = (blocks > 1 && covered < buf.len()).then_some(blocks - 1);
        for index in head.into_iter().chain(tail) {
            let part = &mut buf[index * block_size..(index + 1) * block_size];
            match unwritten {
                true => part.fill(0),
                false => {
                    let device_block = physical + index as u64;
                    self.device
                        .read_into(device_block * block_size as u64, part)?;
                }
            }
        }
        buf[at..covered].copy_from_slice(data);
        Ok(())
    }

    /// Makes the file's data and the metadata needed to read it durable: its cached pages
    /// written back, then a log force up to the inode's last change (whose checkpoint
    /// flushes the device first), or a device flush if that change is durable already.
    /// `data_only` (fdatasync) of a file waits only for its last change other than
    /// timestamps (the size, the mapping, the mode...), as XFS does: an overwrite in place
    /// followed by fdatasync costs a device flush, not a log force.
    pub fn fsync(&self, inode: u64, data_only: bool) -> Result<(), FsError> {
        Self::count(&self.counters.fsyncs, 1);
        let handle = self.live_inode(inode)?;
        if self.write_behind.is_on() {
            // A failure is kept as well as returned: report it from there, once.
            let _ = self.settle(&handle);
            self.take_lost_write(inode)?;
            // After a lost writeback the logged size may still be behind.
            self.write_back_whole(&handle)?;
        }
        let sequence = {
            let data = handle.data.lock();
            // A directory's entries live in logged blocks: fdatasync of one is an fsync.
            match data_only && !data.is_dir() {
                true => data.datasync_sequence,
                false => data.last_sequence,
            }
        };
        if sequence > self.journal.durable_sequence().0 {
            // Data writes precede the transaction that records them, and the checkpoint
            // flushes the device after its commit record (and before it, if it orders
            // data): that flush covers the data.
            self.journal
                .force(cairn_journal::CommitSequence(sequence))?;
        } else {
            self.device.flush()?;
        }
        Ok(())
    }

    /// Changes the size. A shrink commits the new size first and then frees the blocks past
    /// it, leaving the old bytes past the new end in the end-of-file block: a crash at any
    /// point shows either the old file or the new one (zeroing that tail before the size
    /// commits showed zeros inside the old size). A shrink to the middle of a block also
    /// forces the log before returning: later writes into that block go to the device in
    /// place, and under a crash that lost the shrink they showed inside the old size
    /// (docs/reliability.md item 6). A growth clears what lies past the old end first
    /// (`clear_past_eof`), so no stale byte ever comes back into the file.
    pub(crate) fn truncate(&self, inode: u64, size: u64) -> Result<(), FsError> {
        let handle = self.live_inode(inode)?;
        let mut pages = handle.io.write();
        let mut meta = handle.data.lock();
        check_data_file(&meta)?;
        let block_size = u64::from(self.geometry.block_size);
        let old_size = meta.core.size;
        if size > old_size {
            self.clear_past_eof(inode, &mut meta, old_size, size)?;
            pages.zero_from(old_size, block_size);
        } else {
            self.truncate_pages(inode, (&mut pages, &mut meta), size);
        }
        let shrinks_mid_block = size < meta.core.size && !size.is_multiple_of(block_size);
        let mut tx = self.begin(self.write_reservation())?;
        let now = now();
        meta.core.size = size;
        meta.core.mtime = now;
        meta.core.ctime = now;
        // A growth is logged only up to the first cached page past the logged size: the
        // bytes between would read as zeros after a crash, not as what was written there.
        let written_below = pages.first_cached_byte(meta.disk_size, block_size);
        meta.cover_written(written_below);
        meta.emptied_by_truncate |= size == 0 && old_size > 0;
        Self::log_inode(&mut tx, inode, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        if shrinks_mid_block {
            self.journal
                .force(cairn_journal::CommitSequence(meta.last_sequence))?;
        }
        if size > old_size {
            // As on XFS, a growth keeps blocks preallocated past the new end (now unwritten);
            // a truncate to the same size or less gives them back.
            return Ok(());
        }
        crate::unlinked::truncate_blocks(self, inode, &mut meta, size.div_ceil(block_size))
    }

    /// Before the size grows from `old_size` to `new_size`: zeroes on disk the bytes past
    /// `old_size` in its block and marks written blocks of the rest of the range unwritten,
    /// so bytes a shrink left past the end (or a crash left mapped) read as zeros. Both
    /// happen before the size change commits, and the journal flushes the device before any
    /// commit record, so a crash never shows the larger size over stale bytes (XFS's rule).
    pub(crate) fn clear_past_eof(
        &self,
        inode: u64,
        meta: &mut InodeData,
        old_size: u64,
        new_size: u64,
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let eof_block = old_size / block_size;
        if !old_size.is_multiple_of(block_size) {
            // The tail is zeroed in place: a shared block is copied first.
            self.unshare(inode, meta, (eof_block, eof_block + 1))?;
        }
        let map = FileMap::read(self, inode, meta)?;
        if !old_size.is_multiple_of(block_size)
            && let Mapping::Mapped(extent) = map.lookup(eof_block)
            && !extent.unwritten
        {
            let physical = extent.fs_block.0 + (eof_block - extent.file_block);
            let mut buf = AlignedBuf::zeroed(block_size as usize);
            self.device.read_at(physical * block_size, &mut buf)?;
            buf[(old_size % block_size) as usize..].fill(0);
            self.device.write_at(physical * block_size, &buf)?;
        }
        let (first, last) = (old_size.div_ceil(block_size), new_size.div_ceil(block_size));
        let stale = map
            .extents()
            .iter()
            .any(|e| !e.unwritten && e.file_block < last && e.file_end() > first);
        if stale {
            let mut tx = self.begin(self.write_reservation())?;
            let mut map = FileMap::load(self, &mut tx, inode, meta)?;
            map.mark_unwritten(first, last);
            let stored = map.store(self, &mut tx, meta);
            Self::log_inode(&mut tx, inode, meta);
            self.commit(tx, &mut [meta])?;
            stored?;
        }
        Ok(())
    }
}
