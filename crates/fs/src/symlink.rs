//! Symlink targets: inline in the data fork when they fit, else in remote symlink blocks
//! mapped by the data fork's extents.

use cairn_bufcache::{BufKey, HeaderOps, ReadSpec};
use cairn_format::inode::{ForkFormat, local_bytes};
use cairn_format::limits::SYMLINK_LEN_MAX;
use cairn_format::symlink::{decode_symlink_block, encode_symlink_block, symlink_block_capacity};
use cairn_format::{MetaHeader, MetaKind};
use cairn_journal::Reservation;

use crate::FsError;
use crate::bmap::{self, FileMap};
use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::InodeData;

static SYMLINK_OPS: HeaderOps = HeaderOps::new(MetaKind::SymlinkBlock);

fn spec(fs: &Filesystem, inode: u64) -> ReadSpec {
    ReadSpec::new(&SYMLINK_OPS, fs.uuid).with_owner(inode)
}

/// A target must be 1..=4096 bytes without NUL.
pub(crate) fn check_target(target: &[u8]) -> Result<(), FsError> {
    if target.len() > SYMLINK_LEN_MAX {
        return Err(FsError::NameTooLong);
    }
    if target.is_empty() || target.contains(&0) {
        return Err(FsError::InvalidArgument("symlink target empty or with NUL"));
    }
    Ok(())
}

/// Stores `target` in a new symlink inode.
pub(crate) fn store(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    target: &[u8],
) -> Result<(), FsError> {
    data.core.size = target.len() as u64;
    if target.len() <= data.data_fork().len() {
        data.reset_data_fork(ForkFormat::Local);
        data.data_fork_mut()[..target.len()].copy_from_slice(target);
        return Ok(());
    }
    data.reset_data_fork(ForkFormat::Extents);
    let capacity = symlink_block_capacity(fs.geometry.block_size);
    let mut list = Vec::new();
    let inode = data.core.header.blkno;
    for (index, piece) in target.chunks(capacity).enumerate() {
        let extent = bmap::allocate(fs, tx, data, &mut list, index as u64, 1, false)?;
        bmap::store(data, &list)?;
        let block = extent.fs_block.0;
        let guard = tx.tx.get_new_buf(BufKey::single(block), &spec(fs, inode))?;
        let header = MetaHeader::new(MetaKind::SymlinkBlock, block, fs.uuid, inode);
        let len = guard.len();
        let offset = (index * capacity) as u32;
        encode_symlink_block(guard.bytes_mut(0..len)?, header, offset, piece)?;
    }
    Ok(())
}

/// Undoes `store` in the create's transaction `tx` when the create fails after it: frees the
/// target's blocks (and logs their cancel records, since `store` logged them whole).
pub(crate) fn release_new(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let number = data.core.header.blkno;
    bmap::release_inline(fs, tx, data, &spec(fs, number))
}

/// Frees the target blocks of an unlinked symlink: one step unmaps them, invalidates their
/// buffers (a replay of the logged target must never land on the blocks' next owner, file
/// data included) and logs a free intent; a second transaction frees them.
pub(crate) fn free_blocks(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    if data.core.data_format != ForkFormat::Extents {
        return Ok(());
    }
    let mut tx = fs.begin(Reservation::new(
        bmap::step_reservation(fs).bytes + invalidations(fs).bytes,
    ))?;
    let mut map = FileMap::load(fs, &mut tx, number, data)?;
    let removed = map.cut(0, u64::MAX);
    if let Err(error) = bmap::invalidate_extents(&mut tx, &removed, &spec(fs, number)) {
        tx.tx.cancel()?;
        return Err(error);
    }
    bmap::commit_unmap(fs, tx, number, data, &mut map, &removed)
}

/// The log space of invalidating a longest target's blocks (one cancel record each).
fn invalidations(fs: &Filesystem) -> Reservation {
    let blocks = SYMLINK_LEN_MAX.div_ceil(symlink_block_capacity(fs.geometry.block_size));
    Reservation::for_items(&fs.geometry, blocks as u32, fs.geometry.block_size, 0, 0)
}

impl Filesystem {
    /// The target of symlink `inode`.
    pub fn readlink(&self, inode: u64) -> Result<Vec<u8>, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        if data.file_type() != Some(cairn_format::inode::FileType::Symlink) {
            return Err(FsError::InvalidArgument("not a symlink"));
        }
        if data.core.data_format == ForkFormat::Local {
            return Ok(local_bytes(data.data_fork(), data.core.size)?.to_vec());
        }
        let mut target = Vec::with_capacity(data.core.size as usize);
        let mut tx = self.begin(Reservation::new(0))?;
        let result = read_remote(self, &mut tx, &data, &mut target);
        tx.tx.cancel()?;
        result.map(|()| target)
    }
}

fn read_remote(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    target: &mut Vec<u8>,
) -> Result<(), FsError> {
    let inode = data.core.header.blkno;
    for extent in bmap::extents(data)? {
        for block in extent.fs_block.0..extent.fs_block.0 + u64::from(extent.length) {
            let guard = tx.tx.get_buf(BufKey::single(block), &spec(fs, inode))?;
            let (_, piece) = decode_symlink_block(guard)?;
            target.extend_from_slice(piece);
        }
    }
    if target.len() as u64 != data.core.size {
        return Err(FsError::corrupt(
            "symlink",
            inode,
            "target length differs from size",
        ));
    }
    Ok(())
}
