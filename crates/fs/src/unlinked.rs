//! The on-disk unlinked list: inodes whose last link is gone but which are still open or
//! looked up sit in a bucket of their AG's AGI (chained through `next_unlinked`) until the
//! last reference goes; recovery frees whatever a crash left there.
//!
//! Freeing runs in steps: data extents go a few per transaction (each step leaves a
//! consistent, shorter file), then one transaction takes the inode off the list and frees it.

use std::sync::Arc;

use cairn_format::inode::{FileType, ForkFormat};
use cairn_format::limits::AGI_UNLINKED_BUCKETS;
use cairn_format::types::NULL_AG_INODE;
use cairn_journal::Reservation;

use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::ialloc::{self, InodeNumbers, read_agi, write_agi};
use crate::inode::{Inode, InodeData};
use crate::{FsError, dir};

fn bucket(ag_inode: u32) -> usize {
    ag_inode as usize % AGI_UNLINKED_BUCKETS
}

/// Puts inode `number` at the head of its unlinked bucket.
pub(crate) fn add(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let mut agi = read_agi(fs, tx, ag)?;
    let slot = bucket(ag_inode);
    data.core.next_unlinked = agi.unlinked[slot];
    agi.unlinked[slot] = ag_inode;
    write_agi(fs, tx, &agi)
}

/// Takes inode `number` off its unlinked bucket.
fn remove(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let mut agi = read_agi(fs, tx, ag)?;
    let slot = bucket(ag_inode);
    let next = data.core.next_unlinked;
    data.core.next_unlinked = NULL_AG_INODE;
    if agi.unlinked[slot] == ag_inode {
        agi.unlinked[slot] = next;
        return write_agi(fs, tx, &agi);
    }
    let mut current = agi.unlinked[slot];
    // Each step moves to a distinct inode of the bucket; a cycle is corruption.
    for _ in 0..=fs.geometry.ag_len(ag) as u64 * u64::from(fs.geometry.inodes_per_block()) {
        if current == NULL_AG_INODE {
            break;
        }
        let previous = fs.inode(fs.geometry.ag_inode_to_number(ag, current))?;
        let mut previous_data = previous.data.lock();
        if previous_data.core.next_unlinked == ag_inode {
            previous_data.core.next_unlinked = next;
            Filesystem::log_inode(tx, previous.number, &mut previous_data);
            return Ok(());
        }
        current = previous_data.core.next_unlinked;
    }
    Err(FsError::corrupt(
        "unlinked list",
        number,
        "inode not on its bucket",
    ))
}

/// Frees an unlinked inode nobody holds: its data in steps, then the inode.
pub(crate) fn free_orphan(fs: &Filesystem, inode: &Arc<Inode>) -> Result<(), FsError> {
    let _io = inode.io.write();
    let mut data = inode.data.lock();
    if !data.is_allocated() || data.core.nlink != 0 {
        return Ok(());
    }
    let mapped = matches!(
        data.core.data_format,
        ForkFormat::Extents | ForkFormat::Btree
    );
    let is_symlink = data.file_type() == Some(FileType::Symlink);
    if mapped && is_symlink {
        crate::symlink::free_blocks(fs, inode.number, &mut data)?;
    }
    if mapped && !data.is_dir() && !is_symlink {
        truncate_blocks(fs, inode.number, &mut data, 0)?;
    }
    if mapped && data.is_dir() {
        dir::free_blocks_in_steps(fs, inode.number, &mut data)?;
    }
    crate::xattr_store::free_all(fs, inode.number, &mut data)?;
    let mut tx = fs.begin(Reservation::remove(&fs.geometry))?;
    let result = free_now(fs, &mut tx, inode.number, &mut data);
    Filesystem::log_inode(&mut tx, inode.number, &mut data);
    Filesystem::commit(tx, &mut [&mut data])?;
    result
}

fn free_now(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let mapped = matches!(
        data.core.data_format,
        ForkFormat::Extents | ForkFormat::Btree
    );
    if data.is_dir() && mapped {
        dir::free_blocks(fs, tx, data)?;
    }
    remove(fs, tx, number, data)?;
    data.core.mode = 0;
    data.core.size = 0;
    data.core.attr_format = None;
    data.core.attr_offset = 0;
    data.core.attr_extent_count = 0;
    data.reset_data_fork(ForkFormat::Extents);
    data.core.generation = data.core.generation.wrapping_add(1);
    ialloc::free_inode(fs, tx, number)
}

/// Frees every mapped block at or past file block `from`, a few extents per step (see
/// `fallocate::unmap_blocks`). The inode's size is the caller's business.
pub(crate) fn truncate_blocks(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    from: u64,
) -> Result<(), FsError> {
    crate::fallocate::unmap_blocks(fs, number, data, from, u64::MAX)
}

/// At mount: frees every inode a crash left on an unlinked list.
pub(crate) fn recover_unlinked(fs: &Filesystem) -> Result<(), FsError> {
    if fs.options.read_only {
        return Ok(());
    }
    for ag in 0..fs.geometry.ag_count {
        loop {
            let mut tx = fs.begin(Reservation::new(0))?;
            let agi = read_agi(fs, &mut tx, ag);
            tx.tx.cancel()?;
            let agi = agi?;
            let Some(head) = agi.unlinked.iter().copied().find(|&h| h != NULL_AG_INODE) else {
                break;
            };
            let inode = fs.inode(fs.geometry.ag_inode_to_number(ag, head))?;
            {
                let data = inode.data.lock();
                if data.core.nlink != 0 || !data.is_allocated() {
                    return Err(FsError::corrupt(
                        "unlinked list",
                        inode.number,
                        "linked inode",
                    ));
                }
            }
            free_orphan(fs, &inode)?;
        }
    }
    Ok(())
}
