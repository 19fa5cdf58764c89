//! Replay of inode clusters: a whole-block image of a new cluster and a logical inode item
//! for one of its inodes in the same checkpoint (how the filesystem creates an inode in a new
//! chunk). Recovery must end with the inode item's image, whether the cluster's home copy is
//! still unwritten or the AIL wrote it (per-inode LSNs) before the crash.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_blockdev::MemDevice;
use cairn_bufcache::{BufKey, BufferOps};
use cairn_format::{
    AgBlock, AgNumber, FsBlock, HEADER_SIZE, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk,
    Superblock,
};
use cairn_journal::{Journal, LogMode, Reservation, inode_cluster_ops, inode_cluster_spec};
use common::*;
use std::sync::Arc;

/// AG 1 block of the test cluster (free space, away from `common::test_block`'s range).
const CLUSTER_AG_BLOCK: u32 = 200;
/// The slot of the inode created in the new cluster (not slot 0, whose LSN is not the block's).
const USED_SLOT: u32 = 3;
/// The byte that tells a used image (`USED`) from a free one (`FREE`).
const MARK_AT: usize = 200;
const FREE: u8 = 0x11;
const USED: u8 = 0x5a;

fn crash(device: &MemDevice) -> Arc<MemDevice> {
    Arc::new(MemDevice::from_image(device.durable_image(), SECTOR).unwrap())
}

fn cluster_block(sb: &Superblock) -> FsBlock {
    sb.geometry.fs_block(AgNumber(1), AgBlock(CLUSTER_AG_BLOCK))
}

fn inode_at(sb: &Superblock, slot: u32) -> InodeNumber {
    sb.geometry
        .inode_number(AgNumber(1), AgBlock(CLUSTER_AG_BLOCK), slot)
}

/// An inode image for `number` with `mark` at `MARK_AT`, stamped with LSN zero (as the
/// filesystem writes free inode cores into a new chunk).
fn inode_image(sb: &Superblock, number: InodeNumber, mark: u8) -> Vec<u8> {
    let mut raw = vec![0u8; sb.geometry.inode_size as usize];
    let header = MetaHeader::new(MetaKind::Inode, number.0, UUID, number.0);
    raw[..HEADER_SIZE].copy_from_slice(&header.to_bytes());
    raw[MARK_AT] = mark;
    cairn_format::stamp(&mut raw, Some(Lsn::ZERO));
    raw
}

/// Commits one transaction that creates the cluster with every inode free and logs the
/// inode in `USED_SLOT` as used; forces it.
fn create_cluster_and_inode(journal: &Journal, sb: &Superblock) {
    let g = &sb.geometry;
    let reservation = Reservation::for_items(g, 1, g.block_size, 2, 1);
    let mut tx = journal.begin(reservation).unwrap();
    let spec = inode_cluster_spec(g.inode_size, UUID).unwrap();
    let guard = tx
        .get_new_buf(BufKey::single(cluster_block(sb).0), &spec)
        .unwrap();
    for slot in 0..g.inodes_per_block() {
        let image = inode_image(sb, inode_at(sb, slot), FREE);
        guard
            .write(slot as usize * g.inode_size as usize, &image)
            .unwrap();
    }
    let used = USED_SLOT;
    tx.log_inode(
        inode_at(sb, used),
        &inode_image(sb, inode_at(sb, used), USED),
    );
    journal.force(tx.commit().unwrap()).unwrap();
}

/// The cluster block as it is on `device`, checked by the inode cluster verifier.
fn home_cluster(device: &MemDevice, sb: &Superblock) -> Vec<u8> {
    let g = &sb.geometry;
    let block = cluster_block(sb);
    let start = (block.0 * u64::from(g.block_size)) as usize;
    let raw = device.snapshot()[start..start + g.block_size as usize].to_vec();
    let ops = inode_cluster_ops(g.inode_size).unwrap();
    let spec = inode_cluster_spec(g.inode_size, UUID).unwrap();
    ops.verify_read(&raw, block, &spec).unwrap();
    raw
}

fn marks(raw: &[u8], sb: &Superblock) -> Vec<u8> {
    let size = sb.geometry.inode_size as usize;
    raw.chunks_exact(size).map(|inode| inode[MARK_AT]).collect()
}

fn expected_marks(sb: &Superblock) -> Vec<u8> {
    (0..sb.geometry.inodes_per_block())
        .map(|slot| if slot == USED_SLOT { USED } else { FREE })
        .collect()
}

// A new cluster's buffer image and an inode item for one of its inodes, in one checkpoint,
// crash before anything is written home: replay ends with the inode item's image (the
// buffer item, replayed and stamped first, must not make the inode item look applied).
#[test]
fn new_cluster_and_inode_item_in_one_checkpoint_recover() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    create_cluster_and_inode(&journal, &sb);
    let crashed = crash(&device);
    drop(journal);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert_eq!(
        marks(&home_cluster(&crashed, &sb), &sb),
        expected_marks(&sb)
    );
    assert_eq!(report.items_skipped, 0, "{report:?}");
    recovered.unmount().unwrap();
}

// The same checkpoint, but the AIL wrote the cluster home before the crash (the inode with
// its own LSN, the free inodes with LSN zero) and the tail in the log still precedes it:
// replaying the buffer image must not put the free image back over the newer inode.
#[test]
fn written_home_cluster_keeps_inode_through_replay() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    create_cluster_and_inode(&journal, &sb);
    journal.push_ail().unwrap();
    assert_eq!(journal.ail_len(), 0);
    assert_eq!(marks(&home_cluster(&device, &sb), &sb), expected_marks(&sb));
    let crashed = crash(&device);
    drop(journal);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert_eq!(report.checkpoints_replayed, 1, "{report:?}");
    assert_eq!(
        marks(&home_cluster(&crashed, &sb), &sb),
        expected_marks(&sb)
    );
    recovered.unmount().unwrap();
}

// A later checkpoint changes the inode again: both are replayed in order and the newest
// image wins, also when the first checkpoint's buffer and inode item share the block.
#[test]
fn later_inode_item_on_new_cluster_wins() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    create_cluster_and_inode(&journal, &sb);
    let g = &sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(g, 0, g.block_size, 2, 1))
        .unwrap();
    let number = inode_at(&sb, USED_SLOT);
    let mut image = inode_image(&sb, number, USED);
    image[MARK_AT + 1] = 0x77;
    cairn_format::stamp(&mut image, Some(Lsn::ZERO));
    tx.log_inode(number, &image);
    journal.force(tx.commit().unwrap()).unwrap();
    let crashed = crash(&device);
    drop(journal);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert_eq!(report.checkpoints_replayed, 2, "{report:?}");
    let raw = home_cluster(&crashed, &sb);
    assert_eq!(marks(&raw, &sb), expected_marks(&sb));
    let at = USED_SLOT as usize * g.inode_size as usize;
    assert_eq!(raw[at + MARK_AT + 1], 0x77);
    recovered.unmount().unwrap();
}
