//! The on-disk unlinked list: inodes whose last link is gone but which are still open or
//! looked up sit in a bucket of their AG's AGI (chained through `next_unlinked`) until the
//! last reference goes; recovery frees whatever a crash left there.
//!
//! Freeing runs in steps: data extents (or a directory's blocks) go a few per transaction
//! (each step leaves a consistent, smaller inode), then one transaction takes the inode off
//! its list and frees it in the inode trees.
//!
//! Lock order (docs/fs.md): taking an inode off its list changes its predecessor's
//! `next_unlinked`, so the predecessor's inode lock is needed, and inode locks come before
//! buffers. The predecessor is therefore found in memory (`UnlinkedIndex`) and locked
//! before the transaction locks the AGI; under the AGI the lists cannot change, so the
//! index is checked again there and the attempt restarts if the predecessor moved. Walking
//! the list under the AGI, locking each inode on the way, deadlocked against a second
//! freeing thread holding one of those inodes and waiting for the AGI (issue 16).

use std::collections::HashMap;
use std::sync::Arc;

use cairn_format::Agi;
use cairn_format::inode::{FileType, ForkFormat};
use cairn_format::limits::AGI_UNLINKED_BUCKETS;
use cairn_format::types::NULL_AG_INODE;
use cairn_journal::Reservation;
use cairn_lockrank::MutexGuard;

use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::ialloc::{self, InodeNumbers, read_agi, write_agi};
use crate::inode::{Inode, InodeData};
use crate::{FsError, dir};

/// Why a freeing thread may lock the inode before its own on the list while holding its
/// own: the predecessor was put on the list later, so every such wait points at a newer
/// entry and no cycle can form; the predecessor's holders (its writers, its own freeing)
/// never wait for an older entry.
const PREDECESSOR: &str = "unlinked list: the predecessor, a newer entry, after the inode";
/// Attempts at taking an inode off its list before giving up (each one restarts only
/// because another thread changed the same bucket in between).
const UNLIST_ATTEMPTS_MAX: u32 = 10_000;

fn bucket(ag_inode: u32) -> usize {
    ag_inode as usize % AGI_UNLINKED_BUCKETS
}

/// The inodes on one AG's unlinked lists and what precedes each (XFS keeps the same link
/// in its in-core inodes). Changed only under the AG's AGI buffer lock, in the transaction
/// that changes the lists on disk.
#[derive(Debug, Default)]
pub(crate) struct UnlinkedIndex {
    /// AG inode -> the inode before it in its bucket, `NULL_AG_INODE` for a bucket's head.
    previous: HashMap<u32, u32>,
}

impl UnlinkedIndex {
    /// `inode` became its bucket's head, in front of `old_head`.
    fn pushed(&mut self, inode: u32, old_head: u32) {
        self.previous.insert(inode, NULL_AG_INODE);
        if old_head != NULL_AG_INODE {
            self.previous.insert(old_head, inode);
        }
    }

    /// `inode`, followed by `next`, left its bucket.
    fn removed(&mut self, inode: u32, next: u32) {
        let previous = self.previous.remove(&inode);
        if let (Some(previous), true) = (previous, next != NULL_AG_INODE) {
            self.previous.insert(next, previous);
        }
    }

    /// What precedes `inode` on its list (`NULL_AG_INODE` for a head); `None` when it is on
    /// no list.
    fn previous(&self, inode: u32) -> Option<u32> {
        self.previous.get(&inode).copied()
    }
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
    let old_head = agi.unlinked[slot];
    data.core.next_unlinked = old_head;
    agi.unlinked[slot] = ag_inode;
    write_agi(fs, tx, &agi)?;
    fs.ags[ag as usize]
        .unlinked
        .lock()
        .pushed(ag_inode, old_head);
    Ok(())
}

/// Takes inode `number` off its bucket, its predecessor (`previous`: its number and locked
/// data) or the AGI's bucket head pointing past it. The caller holds the AGI (`agi`).
fn unlist(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    agi: &mut Agi,
    number: u64,
    data: &mut InodeData,
    previous: Option<(u64, &mut InodeData)>,
) -> Result<(), FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let slot = bucket(ag_inode);
    let next = data.core.next_unlinked;
    let broken = |why| FsError::corrupt("unlinked list", number, why);
    match previous {
        None if agi.unlinked[slot] != ag_inode => return Err(broken("not its bucket's head")),
        None => {
            agi.unlinked[slot] = next;
            write_agi(fs, tx, agi)?;
        }
        Some((_, ref before)) if before.core.next_unlinked != ag_inode => {
            return Err(broken("its predecessor points elsewhere"));
        }
        Some((before_number, before)) => {
            before.core.next_unlinked = next;
            Filesystem::log_inode(tx, before_number, before);
        }
    }
    data.core.next_unlinked = NULL_AG_INODE;
    fs.ags[ag as usize].unlinked.lock().removed(ag_inode, next);
    Ok(())
}

/// Takes inode `number` off its list in the transaction that put it there (`add`): it is
/// still its bucket's head, since the transaction holds the AGI.
pub(crate) fn take_off_new(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let (ag, _) = fs.geometry.split_inode_number(number)?;
    let mut agi = read_agi(fs, tx, ag)?;
    unlist(fs, tx, &mut agi, number, data, None)
}

/// Where an inode about to leave its unlinked list for a link sits (`relink`): its AG's
/// AGI, joined to the transaction, and its predecessor on the list, locked.
pub(crate) struct ListPlace<'a> {
    ag: u32,
    before: Option<(u64, MutexGuard<'a, InodeData>)>,
}

impl ListPlace<'_> {
    /// Takes inode `number` (`data`, locked by the caller) off its list in `tx`: its
    /// predecessor, logged, or its bucket's head now points past it.
    pub(crate) fn take_off(
        &mut self,
        fs: &Filesystem,
        tx: &mut Tx<'_>,
        number: u64,
        data: &mut InodeData,
    ) -> Result<(), FsError> {
        // The transaction holds the AGI; read it again, as the change may have put other
        // inodes on its lists since.
        let mut agi = read_agi(fs, tx, self.ag)?;
        let before = self.before.as_mut().map(|(n, guard)| (*n, &mut **guard));
        unlist(fs, tx, &mut agi, number, data, before)
    }

    /// The predecessor's data, to record the commit in (`Filesystem::commit`).
    pub(crate) fn predecessor(&mut self) -> Option<&mut InodeData> {
        self.before.as_mut().map(|(_, guard)| &mut **guard)
    }
}

/// Why a thread giving an unlinked inode a link may lock the inode before it on the list
/// while holding it: as for a freeing thread (`PREDECESSOR`), the predecessor is a newer
/// entry, and its holders never wait for an older one.
const RELINK_PREDECESSOR: &str = "unlinked list: the predecessor of an inode getting a link";

/// Begins the transaction that gives inode `number` (no links, on its unlinked list, locked
/// by the caller, who holds no buffer) its first link: an O_TMPFILE file's `linkat`, a
/// whiteout's rename. Locks the inode's predecessor on the list first (inode locks before
/// buffers), then in the transaction the AGIs of `agis` and of the inode's AG in ascending
/// order (the change may put another inode on a list), checks under them that the
/// predecessor is still the one locked (else starts again), and runs `change`, which takes
/// the inode off its list (`ListPlace::take_off`, before it puts any other inode on a list
/// of that AG: that could make a held inode the predecessor) and commits.
pub(crate) fn relink<R>(
    fs: &Filesystem,
    number: u64,
    reservation: Reservation,
    agis: &[u32],
    change: impl FnOnce(Tx<'_>, ListPlace<'_>) -> Result<R, FsError>,
) -> Result<R, FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let index = &fs.ags[ag as usize].unlinked;
    let off_list = || FsError::corrupt("unlinked list", number, "inode not on its AG's lists");
    let mut locked: Vec<u32> = agis.iter().copied().chain([ag]).collect();
    locked.sort_unstable();
    locked.dedup();
    for _ in 0..UNLIST_ATTEMPTS_MAX {
        let previous = index.lock().previous(ag_inode).ok_or_else(off_list)?;
        let before = match previous {
            NULL_AG_INODE => None,
            previous => Some(fs.inode(fs.geometry.ag_inode_to_number(ag, previous))?),
        };
        let before_data = before
            .as_ref()
            .map(|inode| (inode.number, inode.lock_nested(RELINK_PREDECESSOR)));
        // As in `free_unlisted`: a predecessor freed before its lock was taken is not one.
        if before.is_some() && index.lock().previous(ag_inode) != Some(previous) {
            continue;
        }
        let mut tx = fs.begin(reservation)?;
        for &each in &locked {
            read_agi(fs, &mut tx, each)?;
        }
        if index.lock().previous(ag_inode) != Some(previous) {
            tx.tx.cancel()?;
            continue;
        }
        let place = ListPlace {
            ag,
            before: before_data,
        };
        return change(tx, place);
    }
    Err(FsError::corrupt(
        "unlinked list",
        number,
        "its bucket changed under every attempt to take it off",
    ))
}

/// Whether nothing holds the unlinked inode any more: it may be freed.
fn is_orphan(data: &InodeData) -> bool {
    data.is_allocated() && data.core.nlink == 0 && data.lookups == 0 && data.opens == 0
}

/// Frees an unlinked inode nobody holds: what it maps in steps, then the inode.
pub(crate) fn free_orphan(fs: &Filesystem, inode: &Arc<Inode>) -> Result<(), FsError> {
    let mut pages = inode.io.write();
    let mut data = inode.data.lock();
    if !is_orphan(&data) {
        return Ok(());
    }
    fs.truncate_pages(inode.number, (&mut pages, &mut data), 0);
    fs.forget_lost_write(inode.number);
    free_contents(fs, inode.number, &mut data)?;
    free_unlisted(fs, inode.number, &mut data)
}

/// Frees what nothing can reach any more of an unlinked inode nobody has open: all of it
/// when the kernel holds no reference either (`free_orphan`), else a regular file's data
/// (`free_unreachable_data`).
pub(crate) fn free_unreferenced(fs: &Filesystem, inode: &Arc<Inode>) -> Result<(), FsError> {
    free_orphan(fs, inode)?;
    free_unreachable_data(fs, inode)
}

/// Frees at once the data of an unlinked regular file that nobody has open: with no name and
/// no open handle nothing can read or write it, and the kernel's last lookup reference (the
/// `FORGET` that frees the inode) can reach the daemon after the `STATFS` of a `df` run right
/// after `rm` (the request log shows them in that order), which then counted the blocks as
/// in use. The inode itself waits for that reference, on the unlinked list.
pub(crate) fn free_unreachable_data(fs: &Filesystem, inode: &Arc<Inode>) -> Result<(), FsError> {
    let mut pages = inode.io.write();
    let mut data = inode.data.lock();
    let unreachable = data.is_allocated()
        && data.core.nlink == 0
        && data.opens == 0
        && data.file_type() == Some(FileType::Regular)
        && matches!(
            data.core.data_format,
            ForkFormat::Extents | ForkFormat::Btree
        );
    if !unreachable {
        return Ok(());
    }
    fs.truncate_pages(inode.number, (&mut pages, &mut data), 0);
    fs.forget_lost_write(inode.number);
    truncate_blocks(fs, inode.number, &mut data, 0)
}

/// Frees everything the inode maps, a step per transaction: symlink blocks, file data or a
/// directory's blocks, then its attributes.
fn free_contents(fs: &Filesystem, number: u64, data: &mut InodeData) -> Result<(), FsError> {
    let mapped = matches!(
        data.core.data_format,
        ForkFormat::Extents | ForkFormat::Btree
    );
    let is_symlink = data.file_type() == Some(FileType::Symlink);
    if mapped && is_symlink {
        crate::symlink::free_blocks(fs, number, data)?;
    } else if mapped && data.is_dir() {
        dir::free_blocks_in_steps(fs, number, data)?;
        dir::free_remaining_blocks(fs, number, data)?;
    } else if mapped {
        truncate_blocks(fs, number, data, 0)?;
    }
    crate::xattr_store::free_all(fs, number, data)
}

/// The last transaction: the inode off its list and free in the inode trees. It locks the
/// predecessor (found in the index) before the AGI, checks once it holds that lock that the
/// predecessor is still the one in the index (so it is not a freed inode), and checks again
/// under the AGI (a new head may have been inserted before the inode).
fn free_unlisted(fs: &Filesystem, number: u64, data: &mut InodeData) -> Result<(), FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let index = &fs.ags[ag as usize].unlinked;
    let off_list = || FsError::corrupt("unlinked list", number, "inode not on its AG's lists");
    for _ in 0..UNLIST_ATTEMPTS_MAX {
        let previous = index.lock().previous(ag_inode).ok_or_else(off_list)?;
        let before = match previous {
            NULL_AG_INODE => None,
            previous => Some(fs.inode(fs.geometry.ag_inode_to_number(ag, previous))?),
        };
        let mut before_data = before.as_ref().map(|inode| inode.lock_nested(PREDECESSOR));
        // The predecessor may have been freed (and its number allocated again) between the
        // index read and its lock: holding a free inode's lock while waiting for the AGI
        // deadlocks with the allocator, which locks a fresh inode under the AGI. Once locked
        // and still the predecessor, it stays allocated: freeing it needs this lock.
        if before.is_some() && index.lock().previous(ag_inode) != Some(previous) {
            continue;
        }
        let mut tx = fs.begin(Reservation::remove(&fs.geometry))?;
        let mut agi = read_agi(fs, &mut tx, ag)?;
        if index.lock().previous(ag_inode) != Some(previous) {
            tx.tx.cancel()?;
            continue;
        }
        let before_number = before.as_ref().map(|inode| inode.number);
        let linked = before_number.zip(before_data.as_deref_mut());
        let result = unlist(fs, &mut tx, &mut agi, number, data, linked)
            .and_then(|()| free_now(fs, &mut tx, number, data));
        Filesystem::log_inode(&mut tx, number, data);
        let mut logged: Vec<&mut InodeData> = vec![data];
        logged.extend(before_data.as_deref_mut());
        fs.commit(tx, &mut logged)?;
        return result;
    }
    Err(FsError::corrupt(
        "unlinked list",
        number,
        "its bucket changed under every attempt to take it off",
    ))
}

/// Frees the inode (off its list, its contents gone) in the inode trees.
fn free_now(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
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
        let heads = load_index(fs, ag)?;
        for head in heads {
            // Each free takes the bucket's head off, so the next head is freed next.
            let mut next = head;
            while next != NULL_AG_INODE {
                let inode = fs.inode(fs.geometry.ag_inode_to_number(ag, next))?;
                next = inode.data.lock().core.next_unlinked;
                free_orphan(fs, &inode)?;
            }
        }
    }
    Ok(())
}

/// Fills AG `ag`'s index from its lists on disk (at mount, before anything else runs) and
/// returns the buckets' heads. Every inode on a list must be unlinked.
fn load_index(fs: &Filesystem, ag: u32) -> Result<Vec<u32>, FsError> {
    let mut tx = fs.begin(Reservation::new(0))?;
    let agi = read_agi(fs, &mut tx, ag);
    tx.tx.cancel()?;
    let heads: Vec<u32> = agi?
        .unlinked
        .iter()
        .copied()
        .filter(|&head| head != NULL_AG_INODE)
        .collect();
    // Each step visits a distinct inode of the AG; more steps than inodes is a cycle.
    let steps_max = u64::from(fs.geometry.ag_len(ag)) * u64::from(fs.geometry.inodes_per_block());
    let mut steps = 0u64;
    // Filled outside the index's lock: it ranks below inode locks.
    let mut found: HashMap<u32, u32> = HashMap::new();
    for &head in &heads {
        let mut previous = NULL_AG_INODE;
        let mut current = head;
        while current != NULL_AG_INODE {
            steps += 1;
            let number = fs.geometry.ag_inode_to_number(ag, current);
            if steps > steps_max || found.contains_key(&current) {
                return Err(FsError::corrupt("unlinked list", number, "a cycle"));
            }
            let inode = fs.inode(number)?;
            let data = inode.data.lock();
            if data.core.nlink != 0 || !data.is_allocated() {
                return Err(FsError::corrupt("unlinked list", number, "linked inode"));
            }
            found.insert(current, previous);
            previous = current;
            current = data.core.next_unlinked;
        }
    }
    fs.ags[ag as usize].unlinked.lock().previous = found;
    Ok(heads)
}
