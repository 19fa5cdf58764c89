//! Inode create items (new inode clusters logged logically, XFS's icreate): the cluster's free
//! inodes come back from the item on replay, never over an inode the AIL wrote home from a
//! newer inode item, and the cluster buffer still reaches home through the AIL. The crash test
//! runs random sequences of cluster creations, inode changes (images of varying used length,
//! so trimmed images are replayed too), forces, checkpoint and AIL pushes, then crashes at
//! every flush point and at random points between: every created cluster must equal its state
//! after some committed prefix covering every completed force, and clusters not yet created in
//! that prefix must be untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_blockdev::{CrashPoint, MemDevice};
use cairn_bufcache::{BufKey, BufferOps};
use cairn_format::inode::free_inode_core;
use cairn_format::{
    AgBlock, AgNumber, FsBlock, HEADER_SIZE, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk,
    Superblock,
};
use cairn_journal::{
    Journal, LogMode, Reservation, Transaction, inode_cluster_ops, inode_cluster_spec,
};
use common::*;
use std::sync::Arc;

/// AG 1 block of the first test cluster (free space, away from `common::test_block`'s range).
const FIRST_CLUSTER_AG_BLOCK: u32 = 200;
const CLUSTERS: u32 = 3;
/// Where the random images put their marks: inside the core, and in the literal area.
const CORE_MARK_AT: usize = 200;

fn cluster_block(sb: &Superblock, cluster: u32) -> FsBlock {
    let block = AgBlock(FIRST_CLUSTER_AG_BLOCK + cluster);
    sb.geometry.fs_block(AgNumber(1), block)
}

fn inode_at(sb: &Superblock, cluster: u32, slot: u32) -> InodeNumber {
    let block = AgBlock(FIRST_CLUSTER_AG_BLOCK + cluster);
    sb.geometry.inode_number(AgNumber(1), block, slot)
}

fn generation_of(cluster: u32) -> u32 {
    0x1000 + cluster
}

/// The free inode a new cluster holds (what the filesystem wrote before inode create items).
fn free_image(sb: &Superblock, number: InodeNumber, generation: u32) -> Vec<u8> {
    let mut raw = vec![0u8; sb.geometry.inode_size as usize];
    let header = MetaHeader::new(MetaKind::Inode, number.0, UUID, number.0);
    free_inode_core(header, generation).encode(&mut raw);
    cairn_format::stamp(&mut raw, Some(Lsn::ZERO));
    raw
}

/// A used-looking image: the free image with `mark` at `CORE_MARK_AT` and at `tail_at` (0 for
/// none), so images of different used lengths follow each other.
fn used_image(sb: &Superblock, number: InodeNumber, mark: u8, tail_at: usize) -> Vec<u8> {
    let mut raw = free_image(sb, number, 7);
    raw[CORE_MARK_AT] = mark;
    if tail_at > 0 {
        raw[tail_at] = mark;
    }
    cairn_format::stamp(&mut raw, Some(Lsn::ZERO));
    raw
}

/// An image with its CRC and LSN fields zeroed (both restamped on the way home).
fn normalised(image: &[u8]) -> Vec<u8> {
    let mut image = image.to_vec();
    image[4..8].fill(0);
    image[16..24].fill(0);
    image
}

fn create_cluster(tx: &mut Transaction<'_>, sb: &Superblock, cluster: u32) {
    let spec = inode_cluster_spec(sb.geometry.inode_size, UUID).unwrap();
    let key = BufKey::single(cluster_block(sb, cluster).0);
    let first = inode_at(sb, cluster, 0);
    tx.get_new_inode_cluster(key, &spec, first, generation_of(cluster))
        .unwrap();
}

/// The expected clusters: `None` for one not created, else each slot's normalised image.
type Model = Vec<Option<Vec<Vec<u8>>>>;

fn new_cluster_model(sb: &Superblock, cluster: u32) -> Vec<Vec<u8>> {
    (0..sb.geometry.inodes_per_block())
        .map(|slot| {
            let number = inode_at(sb, cluster, slot);
            normalised(&free_image(sb, number, generation_of(cluster)))
        })
        .collect()
}

/// What `device` holds for every cluster, compared with `model`: a created cluster verifies and
/// equals its model slot by slot; one not created is still all zeros.
fn matches_model(device: &MemDevice, sb: &Superblock, model: &Model) -> bool {
    let g = &sb.geometry;
    let image = device.snapshot();
    let ops = inode_cluster_ops(g.inode_size).unwrap();
    let spec = inode_cluster_spec(g.inode_size, UUID).unwrap();
    (0..CLUSTERS).all(|cluster| {
        let block = cluster_block(sb, cluster);
        let start = (block.0 * u64::from(g.block_size)) as usize;
        let raw = &image[start..start + g.block_size as usize];
        match &model[cluster as usize] {
            None => raw.iter().all(|&b| b == 0),
            Some(slots) => {
                ops.verify_read(raw, block, &spec).is_ok()
                    && raw
                        .chunks_exact(g.inode_size as usize)
                        .zip(slots)
                        .all(|(home, want)| normalised(home) == *want)
            }
        }
    })
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// One random transaction: maybe a new cluster, one or two inode images in created clusters,
/// and a rewrite of test block 0 (relogged often, so it pins the tail at an old LSN while the
/// AIL writes the clusters home: replay then starts before their create items).
/// Returns whether it forced its commit.
fn random_transaction(
    journal: &Journal,
    sb: &Superblock,
    rng: &mut Rng,
    model: &mut Model,
) -> bool {
    let g = &sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(g, 2, g.block_size, 2, 0))
        .unwrap();
    let next = model.iter().position(Option::is_none);
    if let Some(cluster) = next
        && (rng.below(3) == 0 || model.iter().all(Option::is_none))
    {
        create_cluster(&mut tx, sb, cluster as u32);
        model[cluster] = Some(new_cluster_model(sb, cluster as u32));
    }
    let created: Vec<u32> = (0..CLUSTERS)
        .filter(|&c| model[c as usize].is_some())
        .collect();
    for _ in 0..1 + rng.below(2) {
        let cluster = created[rng.below(created.len() as u64) as usize];
        let slot = rng.below(u64::from(g.inodes_per_block())) as u32;
        let number = inode_at(sb, cluster, slot);
        let mark = 1 + rng.below(255) as u8;
        let tail_at = match rng.below(3) {
            0 => 0,
            _ => 300 + rng.below(u64::from(g.inode_size) - 300) as usize,
        };
        let image = used_image(sb, number, mark, tail_at);
        tx.log_inode(number, &image);
        if let Some(slots) = model[cluster as usize].as_mut() {
            slots[slot as usize] = normalised(&image);
        }
    }
    if rng.below(2) == 0 {
        let guard = tx.get_buf(test_block(sb, 0), &spec()).unwrap();
        let at = HEADER_SIZE + rng.below(64) as usize;
        guard.bytes_mut(at..at + 1).unwrap().fill(rng.next() as u8);
    }
    let sequence = tx.commit().unwrap();
    let forced = rng.below(8) < 2;
    match rng.below(8) {
        _ if forced => journal.force(sequence).unwrap(),
        0..=2 => journal.push_ail().unwrap(),
        3 => journal.push_checkpoint().unwrap(),
        _ => {}
    }
    journal.check_invariants();
    forced
}

fn run_sequence(seed: u64) {
    let (device, sb) = make_fs(16 << 20, Some(1 << 20));
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let g = sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 0, 0))
        .unwrap();
    create_block(&mut tx, &sb, 0, 0);
    journal.force(tx.commit().unwrap()).unwrap();
    let mut rng = Rng(seed);
    let mut model: Model = vec![None; CLUSTERS as usize];
    let mut states = vec![model.clone()];
    // (state index a completed force covered, flushes done when it returned)
    let mut forced: Vec<(usize, usize)> = Vec::new();
    for _ in 0..30 {
        let was_forced = random_transaction(&journal, &sb, &mut rng, &mut model);
        states.push(model.clone());
        if was_forced {
            forced.push((states.len() - 1, device.flush_count()));
        }
    }
    journal.force_all().unwrap();
    forced.push((states.len() - 1, device.flush_count()));
    journal.push_ail().unwrap();
    assert!(
        matches_model(&device, &sb, &model),
        "seed {seed}: AIL did not write clusters home"
    );
    let points = device.crash_points(1, seed);
    for point in points {
        let crashed = Arc::new(device.crash_device(&point).unwrap());
        let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
        let required = forced
            .iter()
            .filter(|(_, flushes)| *flushes <= point.flush_index)
            .map(|(state, _)| *state)
            .max()
            .unwrap_or(0);
        let found = (required..states.len()).any(|k| matches_model(&crashed, &sb, &states[k]));
        assert!(
            found,
            "seed {seed}: crash at {point:?} recovered no state >= {required}: {report:?}"
        );
        recovered.check_invariants();
        drop(recovered);
    }
}

// Random cluster creations and inode changes, crashed at every flush point and between:
// every created cluster recovers to a committed prefix covering each completed force.
#[test]
fn inode_create_crashes_recover_a_prefix() {
    for seed in 1..=3 {
        run_sequence(seed);
    }
}

/// Commits a transaction that creates cluster 0 and logs inode `slot` of it as used; forces.
fn create_with_inode(journal: &Journal, sb: &Superblock, slot: u32, mark: u8) -> Vec<u8> {
    let g = &sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(g, 1, g.block_size, 1, 0))
        .unwrap();
    create_cluster(&mut tx, sb, 0);
    let number = inode_at(sb, 0, slot);
    let image = used_image(sb, number, mark, 0);
    tx.log_inode(number, &image);
    journal.force(tx.commit().unwrap()).unwrap();
    image
}

fn crash(device: &MemDevice) -> Arc<MemDevice> {
    Arc::new(MemDevice::from_image(device.durable_image(), SECTOR).unwrap())
}

// The create item costs a few dozen bytes, not the block; replayed before anything reached
// home, it gives back the free inodes of the cluster and the inode item's image on top.
#[test]
fn create_item_is_small_and_replays_onto_an_empty_home() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let before = journal.stats().log_bytes;
    let image = create_with_inode(&journal, &sb, 3, 0x5a);
    let logged = journal.stats().log_bytes - before;
    // Start, create and (trimmed) inode items in one one-block record, then a commit record
    // (the whole cluster block alone would need a second data block).
    assert!(logged <= 2 * u64::from(sb.geometry.block_size), "{logged}");
    let crashed = crash(&device);
    drop(journal);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    let mut model: Model = vec![None; CLUSTERS as usize];
    let mut slots = new_cluster_model(&sb, 0);
    slots[3] = normalised(&image);
    model[0] = Some(slots);
    assert!(matches_model(&crashed, &sb, &model), "{report:?}");
    assert_eq!(report.items_skipped, 0, "{report:?}");
    recovered.unmount().unwrap();
}

// The order that matters: the cluster goes home, a later inode item goes home too, and the
// tail stays before the create (an older block pinned in the AIL). Replaying the old create
// must keep the newer inode and re-create only the inodes whose home copy is older.
#[test]
fn old_create_does_not_wipe_newer_inodes_written_home() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let g = sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 0, 0))
        .unwrap();
    create_block(&mut tx, &sb, 0, 1);
    journal.force(tx.commit().unwrap()).unwrap();
    create_with_inode(&journal, &sb, 3, 0x5a);
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 1, 0))
        .unwrap();
    let number = inode_at(&sb, 0, 5);
    let newer = used_image(&sb, number, 0x77, 400);
    tx.log_inode(number, &newer);
    // Test block 0 relogged and left in the CIL: pinned, so the AIL push cannot write it and
    // the tail stays at its first checkpoint, before the create.
    let guard = tx.get_buf(test_block(&sb, 0), &spec()).unwrap();
    guard.bytes_mut(HEADER_SIZE..HEADER_SIZE + 1).unwrap()[0] = 2;
    journal.force(tx.commit().unwrap()).unwrap();
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 0, 0))
        .unwrap();
    let guard = tx.get_buf(test_block(&sb, 0), &spec()).unwrap();
    guard.bytes_mut(HEADER_SIZE..HEADER_SIZE + 1).unwrap()[0] = 3;
    tx.commit().unwrap();
    journal.push_ail().unwrap();
    assert!(journal.ail_len() >= 1, "test block should stay in the AIL");
    let (_, tail) = journal.head_and_tail();
    let crashed = crash(&device);
    drop(journal);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.tail <= tail, "{report:?}");
    assert_eq!(report.checkpoints_replayed, 3, "{report:?}");
    let mut slots = new_cluster_model(&sb, 0);
    slots[3] = normalised(&used_image(&sb, inode_at(&sb, 0, 3), 0x5a, 0));
    slots[5] = normalised(&newer);
    let mut model: Model = vec![None; CLUSTERS as usize];
    model[0] = Some(slots);
    assert!(matches_model(&crashed, &sb, &model), "{report:?}");
    assert!(report.items_skipped >= 1, "{report:?}");
    recovered.unmount().unwrap();
}

/// Sector patterns of a torn cluster write: which sectors of the block reach the medium.
fn tear_patterns(sectors: usize, inode_sector: usize) -> Vec<Vec<bool>> {
    vec![
        (0..sectors).map(|s| s != 0).collect(),
        (0..sectors).map(|s| s == inode_sector).collect(),
        (0..sectors).map(|s| s % 2 == 1).collect(),
        (0..sectors).map(|s| s % 2 == 0).collect(),
    ]
}

// The cluster and an inode item in one checkpoint; the AIL's write of the cluster home is torn
// so that its first sector (the only one replay used to look at to tell an inode cluster) is
// still the old, never-written block while the inode's sector is new. Replay must still decide
// per inode: the create re-creates the free inodes, and the inode item's image wins over the
// free one (it used to be skipped as "already home" after the create had wiped it).
#[test]
fn torn_cluster_write_home_keeps_the_logged_inode() {
    let slot = 1u32;
    let (device, sb) = make_fs_with_sectors(64 << 20, None, 512);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let image = create_with_inode(&journal, &sb, slot, 0x5a);
    let flushes = device.flush_count();
    journal.push_ail().unwrap();
    let g = sb.geometry;
    let home = g.byte_offset(cluster_block(&sb, 0));
    let writes = device.writes_after_flush(flushes);
    let index = writes
        .iter()
        .position(|w| w.offset <= home && home < w.offset + w.len)
        .expect("the AIL push wrote the cluster home");
    let write = writes[index];
    assert_eq!(write.offset, home, "the cluster is the start of its write");
    let sectors = (write.len / 512) as usize;
    let inode_sector = (slot * g.inode_size / 512) as usize;
    let mut slots = new_cluster_model(&sb, 0);
    slots[slot as usize] = normalised(&image);
    let mut model: Model = vec![None; CLUSTERS as usize];
    model[0] = Some(slots);
    drop(journal);
    for kept in tear_patterns(sectors, inode_sector) {
        let point = CrashPoint::at_flush(flushes).tear(index, kept.clone());
        let crashed = Arc::new(device.crash_device(&point).unwrap());
        let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
        assert!(
            matches_model(&crashed, &sb, &model),
            "sectors kept {kept:?}: {report:?}"
        );
        recovered.unmount().unwrap();
    }
}

// A bad first inode is refused before anything joins the transaction.
#[test]
fn create_of_a_wrong_first_inode_is_refused() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let g = sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 0, 0))
        .unwrap();
    let spec = inode_cluster_spec(g.inode_size, UUID).unwrap();
    let key = BufKey::single(cluster_block(&sb, 0).0);
    let wrong = inode_at(&sb, 0, 1);
    assert!(tx.get_new_inode_cluster(key, &spec, wrong, 1).is_err());
    tx.cancel().unwrap();
    drop(device);
}
