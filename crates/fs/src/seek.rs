//! `SEEK_DATA` / `SEEK_HOLE`. Unwritten extents count as holes (as XFS does for unwritten
//! extents without cached data): they read as zeros. End of file is an implicit hole.

use cairn_format::Extent;

use crate::FsError;
use crate::bmap::FileMap;
use crate::data::check_data_file;
use crate::fs::Filesystem;
use crate::types::SeekKind;

impl Filesystem {
    /// The first offset at or after `offset` that starts data (`SeekKind::Data`) or lies in
    /// a hole (`SeekKind::Hole`). `NoSuchOffset` when `offset` is at or past the end of the
    /// file, or when no data follows it.
    pub fn seek(&self, inode: u64, offset: u64, kind: SeekKind) -> Result<u64, FsError> {
        let handle = self.live_inode(inode)?;
        // The mapping answers, so cached data must have its blocks first.
        self.settle(&handle)?;
        let _io = handle.io.read();
        let (size, map) = {
            let data = handle.data.lock();
            check_data_file(&data)?;
            (data.core.size, FileMap::read(self, inode, &data)?)
        };
        if offset >= size {
            return Err(FsError::NoSuchOffset);
        }
        let block_size = u64::from(self.geometry.block_size);
        let found = match kind {
            SeekKind::Data => next_data(map.extents(), offset / block_size)
                .map(|block| (block * block_size).max(offset))
                .filter(|&at| at < size)
                .ok_or(FsError::NoSuchOffset)?,
            SeekKind::Hole => {
                let block = next_hole(map.extents(), offset / block_size);
                block.saturating_mul(block_size).max(offset).min(size)
            }
        };
        Ok(found)
    }
}

/// One mapped range of a file, as `Filesystem::file_extents` reports it (FIEMAP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileExtent {
    /// Byte offset in the file.
    pub offset: u64,
    /// Byte address on the device.
    pub physical: u64,
    pub length: u64,
    /// Allocated but reading as zeros.
    pub unwritten: bool,
}

impl Filesystem {
    /// The file's mapped ranges in order (FIEMAP), including those past end of file.
    pub fn file_extents(&self, inode: u64) -> Result<Vec<FileExtent>, FsError> {
        let handle = self.live_inode(inode)?;
        // The mapping answers, so cached data must have its blocks first.
        self.settle(&handle)?;
        let _io = handle.io.read();
        let data = handle.data.lock();
        check_data_file(&data)?;
        let map = FileMap::read(self, inode, &data)?;
        let block_size = u64::from(self.geometry.block_size);
        Ok(map
            .extents()
            .iter()
            .map(|e| FileExtent {
                offset: e.file_block * block_size,
                physical: e.fs_block.0 * block_size,
                length: u64::from(e.length) * block_size,
                unwritten: e.unwritten,
            })
            .collect())
    }
}

/// The first block at or after `block` mapped to written data.
fn next_data(list: &[Extent], block: u64) -> Option<u64> {
    let index = list.partition_point(|e| e.file_end() <= block);
    list[index..]
        .iter()
        .find(|e| !e.unwritten)
        .map(|e| e.file_block.max(block))
}

/// The first block at or after `block` that is a hole or unwritten.
fn next_hole(list: &[Extent], block: u64) -> u64 {
    let mut at = block;
    let index = list.partition_point(|e| e.file_end() <= block);
    for extent in &list[index..] {
        if extent.file_block > at || extent.unwritten {
            return at;
        }
        at = extent.file_end();
    }
    at
}

#[cfg(test)]
mod tests {
    use cairn_format::FsBlock;

    use super::*;

    fn extent(file_block: u64, length: u32, unwritten: bool) -> Extent {
        Extent::new(file_block, FsBlock(1000 + file_block), length, unwritten).unwrap()
    }

    // Checks data and hole searches over written, unwritten and unmapped stretches.
    #[test]
    fn data_and_holes_are_found() {
        let list = [
            extent(2, 3, false),
            extent(5, 2, true),
            extent(10, 1, false),
        ];
        assert_eq!(next_data(&list, 0), Some(2));
        assert_eq!(next_data(&list, 3), Some(3));
        assert_eq!(next_data(&list, 5), Some(10));
        assert_eq!(next_data(&list, 11), None);
        assert_eq!(next_hole(&list, 0), 0);
        assert_eq!(next_hole(&list, 2), 5);
        assert_eq!(next_hole(&list, 10), 11);
    }
}
