//! Shared extents (reflink): refcount intents and their finishing, and the staging blocks a
//! crash left behind.
//!
//! A file on a filesystem with the reflink feature may map blocks other files map too
//! (`INODE_FLAG_REFLINK`); the per-AG refcount trees count those mappings
//! (`cairn_alloc::Allocator::change_references`). Changes to the counts of blocks in other
//! AGs than the one a transaction may still lock (AG locks ascend) go through refcount
//! intents: the transaction that changes a file's map names the updates in an intent, and
//! finishing transactions apply them and log the done item (`finish_refcount_intent`),
//! a bounded amount each: one that cannot do all the updates logs the rest as a new intent
//! with the first one's done item, as XFS relogs a deferred operation. Mount finishes what a
//! crash left (`Filesystem::finish_intents`) and frees the blocks of copy-on-writes that
//! never reached a file map (`free_leftover_staging`).

use cairn_format::log::RefcountUpdate;
use cairn_format::{AgNumber, MetaKind};
use cairn_journal::{IntentId, RefcountOp, Reservation};

use crate::FsError;
use crate::bmap::{free_tree_levels, levels_bound};
use crate::fs::Filesystem;
use crate::glue::{JournalLog, free_sequence};

/// Records of the refcount tree one `change_references` call may rewrite: bounds the
/// buffers a call joins (`refcount_call_buffers`).
const RECORDS_PER_CALL: usize = 8;

/// Height bound of an AG's refcount tree (at most one record per block).
fn refcount_tree_levels(fs: &Filesystem) -> u32 {
    let records = u64::from(fs.geometry.ag_blocks);
    levels_bound(MetaKind::RefcountBtree, fs.geometry.block_size, records)
}

/// Most buffers one refcount change joins: the AGF and AGFL; both free-space trees twice
/// (the free-list refill before each insert and the frees of a decrease: a split path and
/// new root each, `2 * 2 * (free_levels + 1)`); and in the refcount tree the leaves
/// `RECORDS_PER_CALL` records and their neighbours span (4), a path above them with a
/// sibling at each level for merges and borrows (`3 * levels`), and a split path with a
/// new root (`levels + 1`).
pub(crate) fn refcount_call_buffers(fs: &Filesystem) -> u32 {
    let levels = refcount_tree_levels(fs);
    2 + 4 * (free_tree_levels(fs) + 1) + 4 + 3 * levels + levels + 1
}

/// The reservation of a transaction finishing refcount updates: two calls' buffers, an
/// intent and a done item.
pub(crate) fn refcount_reservation(fs: &Filesystem) -> Reservation {
    let buffers = 2 * refcount_call_buffers(fs);
    Reservation::for_items(&fs.geometry, buffers, fs.geometry.block_size, 0, 2)
}

/// Applies the refcount `updates` intent `intent` named and logs its done item, in as many
/// finishing transactions as they take (each logs the rest as a new intent).
pub(crate) fn finish_refcount_intent(
    fs: &Filesystem,
    intent: IntentId,
    updates: &[RefcountUpdate],
) -> Result<(), FsError> {
    let mut left = updates.to_vec();
    // Ascending blocks are ascending AGs: the allocator's lock order within a transaction.
    left.sort_by_key(|update| update.start.0);
    let frees = left.iter().any(|update| update.op == RefcountOp::Decrease);
    let per_call = refcount_call_buffers(fs) as usize;
    let mut intent = intent;
    loop {
        let mut tx = fs.begin_finishing(refcount_reservation(fs))?;
        let sequence = free_sequence(&fs.journal);
        let log = JournalLog(&fs.journal);
        while let Some(update) = left.first_mut() {
            if tx.tx.joined_count() + per_call > 2 * per_call {
                break;
            }
            let range = (update.start, update.length);
            let calls = (sequence, RECORDS_PER_CALL);
            let done = fs
                .alloc
                .change_references(&mut tx, &log, range, update.op, calls)?;
            update.start.0 += u64::from(done);
            update.length -= done;
            if update.length == 0 {
                left.remove(0);
            }
        }
        tx.tx.log_refcount_done(intent);
        if !left.is_empty() {
            intent = tx.tx.log_refcount_intent(&left);
        }
        tx.tx.commit()?;
        if left.is_empty() {
            if frees {
                fs.blocks_freed();
            }
            return Ok(());
        }
    }
}

/// At mount, after the intents are finished: frees the staging blocks of every copy-on-write
/// a crash interrupted (their data never reached a file map). A cleanly unmounted
/// filesystem has none (every copy-on-write ends by unstaging or freeing its blocks).
pub(crate) fn free_leftover_staging(fs: &Filesystem) -> Result<(), FsError> {
    if fs.options.read_only || fs.recovery.clean || !fs.superblock.has_reflink() {
        return Ok(());
    }
    for ag in 0..fs.geometry.ag_count {
        let mut tx = fs.begin(Reservation::new(0))?;
        let runs = fs.alloc.staged_runs(&mut tx, AgNumber(ag));
        tx.tx.cancel()?;
        for (start, length) in runs? {
            let mut tx = fs.begin_finishing(refcount_reservation(fs))?;
            let sequence = free_sequence(&fs.journal);
            let log = JournalLog(&fs.journal);
            fs.alloc
                .free_staged(&mut tx, &log, (start, length), sequence)?;
            tx.tx.commit()?;
            fs.blocks_freed();
            tracing::info!(
                block = start.0,
                length,
                "freed copy-on-write staging blocks a crash left"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_alloc::Request;
    use cairn_blockdev::{BlockDevice, MemDevice};
    use cairn_format::FsBlock;

    use super::*;
    use crate::types::{Credentials, FileKind, MountOptions};

    // Crashes after a transaction logged a refcount intent (sharing a file's blocks and,
    // over 40 alternating records, dropping shares) and another staged blocks for a
    // copy-on-write: mount applies the intents, in transactions of bounded size, and frees
    // the staged blocks.
    #[test]
    fn mount_finishes_refcount_intents_and_frees_staging() {
        let device = Arc::new(crate::test_device::formatted(64 << 20, [7; 16]));
        let dyn_device: Arc<dyn BlockDevice> = device.clone();
        let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
        let who = Credentials::root();
        let file = fs
            .create(fs.root(), b"f", FileKind::Regular, 0o644, 0, &who)
            .unwrap();
        fs.write(file.inode, 0, &vec![1u8; 384 << 10]).unwrap();
        fs.sync().unwrap();
        let owned_before = owned(&fs);
        let extent = fs.file_extents(file.inode).unwrap()[0];
        let start = FsBlock(extent.physical / 4096);
        share_then_crash(&fs, start);
        let image = device.durable_image();
        drop(fs);
        let crashed: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_image(image, 4096).unwrap());
        let fs = Filesystem::mount(crashed, MountOptions::default()).unwrap();
        assert_eq!(fs.recovery_report().unfinished_intents.len(), 1);
        let ag = fs.geometry.ag_of(start);
        let (records, summary) = {
            let mut tx = fs.begin(Reservation::new(0)).unwrap();
            let records = fs.alloc.refcount_records(&mut tx, ag).unwrap();
            let summary = fs.alloc.check_invariants(&mut tx, ag).unwrap();
            tx.tx.cancel().unwrap();
            (records, summary)
        };
        assert_eq!(records.len(), 1, "{records:?}");
        let first = fs.geometry.ag_block_of(start).0;
        assert_eq!((records[0].start.0, records[0].length), (first + 80, 4));
        assert_eq!(summary.refcount_records, records);
        // The staged blocks are the allocator's again; of the file's 80 blocks, the 40 that
        // counted 1 before the decrease were freed by it (the 40 shared ones count 1 now).
        assert_eq!(owned(&fs), owned_before + 40);
        fs.unmount().unwrap();
    }

    /// Blocks the allocator owns: free, on free lists, in its trees.
    fn owned(fs: &Filesystem) -> u64 {
        let mut tx = fs.begin(Reservation::new(0)).unwrap();
        let mut owned = 0;
        for ag in 0..fs.geometry.ag_count {
            let s = fs.alloc.check_invariants(&mut tx, AgNumber(ag)).unwrap();
            owned += u64::from(s.free_blocks) + s.free_list.len() as u64;
            owned += s.tree_blocks + s.refcount_blocks;
        }
        tx.tx.cancel().unwrap();
        owned
    }

    /// Shares every other block of the 80 at `start`, then logs an intent to share the next
    /// 4 and drop a share of all 80, and stages 8 new blocks; everything durable.
    fn share_then_crash(fs: &Filesystem, start: FsBlock) {
        let log = JournalLog(&fs.journal);
        let mut tx = fs.begin(refcount_reservation(fs)).unwrap();
        for block in (0..80).step_by(2) {
            let at = (FsBlock(start.0 + block), 1);
            let calls = (free_sequence(&fs.journal), RECORDS_PER_CALL);
            fs.alloc
                .change_references(&mut tx, &log, at, RefcountOp::Increase, calls)
                .unwrap();
        }
        tx.tx.commit().unwrap();
        let updates = [
            RefcountUpdate {
                op: RefcountOp::Increase,
                start: FsBlock(start.0 + 80),
                length: 4,
            },
            RefcountUpdate {
                op: RefcountOp::Decrease,
                start,
                length: 80,
            },
        ];
        let mut tx = fs.begin(refcount_reservation(fs)).unwrap();
        tx.tx.log_refcount_intent(&updates);
        let staged = fs
            .alloc
            .allocate(&mut tx, &log, &Request::near(FsBlock(0), 8, 8))
            .unwrap()
            .unwrap();
        fs.alloc
            .stage(&mut tx, &log, (staged.fs_start, staged.length))
            .unwrap();
        tx.tx.commit().unwrap();
        fs.sync().unwrap();
    }
}
