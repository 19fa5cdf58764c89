//! Journal behaviour on small hand-written sequences: clean logs, forces, relogging, sync mode,
//! inode items, intents, freed blocks, log wrap under space pressure, cancel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_blockdev::MemDevice;
use cairn_bufcache::ReadSpec;
use cairn_format::{FsBlock, HEADER_SIZE, InodeNumber};
use cairn_journal::{
    FreeExtent, IntentWork, JournalConfig, JournalError, LogMode, RefcountOp, RefcountUpdate,
    Reservation,
};
use common::*;
use std::sync::Arc;
use std::time::Duration;

fn reservation(superblock: &cairn_format::Superblock, buffers: u32) -> Reservation {
    let g = &superblock.geometry;
    Reservation::for_items(g, buffers, g.block_size, 2, 1)
}

fn crash(device: &MemDevice) -> Arc<MemDevice> {
    Arc::new(MemDevice::from_image(device.durable_image(), SECTOR).unwrap())
}

// A freshly made log opens clean, and a clean unmount leaves a log that needs no recovery.
#[test]
fn fresh_and_unmounted_logs_are_clean() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, report) = open(&device, &sb, quiet(LogMode::Delayed));
    assert!(report.clean);
    assert_eq!(report.records, 0);
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    create_block(&mut tx, &sb, 0, 5);
    tx.commit().unwrap();
    journal.check_invariants();
    journal.unmount().unwrap();
    let (journal, report) = open(&device, &sb, quiet(LogMode::Delayed));
    assert!(report.clean, "{report:?}");
    assert_eq!(report.checkpoints_replayed, 0);
    assert_eq!(
        read_body(device.as_ref(), &sb, 0),
        vec![5; 4096 - HEADER_SIZE]
    );
    journal.unmount().unwrap();
}

// Forced commits survive a crash (replayed from the log); unforced ones may be lost.
#[test]
fn forced_commits_are_recovered() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut tx = journal.begin(reservation(&sb, 2)).unwrap();
    create_block(&mut tx, &sb, 0, 1);
    create_block(&mut tx, &sb, 1, 2);
    let sequence = tx.commit().unwrap();
    assert!(journal.durable_sequence() < sequence);
    journal.force(sequence).unwrap();
    assert!(journal.durable_sequence() >= sequence);
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    let guard = tx.get_buf(test_block(&sb, 1), &spec()).unwrap();
    guard.write(100, &[9; 8]).unwrap();
    tx.commit().unwrap();
    journal.check_invariants();
    let crashed = crash(&device);
    drop(journal);
    let (journal, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert_eq!(report.checkpoints_replayed, 1, "{report:?}");
    assert!(!report.clean);
    assert_eq!(
        read_body(crashed.as_ref(), &sb, 0),
        vec![1; 4096 - HEADER_SIZE]
    );
    assert_eq!(
        read_body(crashed.as_ref(), &sb, 1),
        vec![2; 4096 - HEADER_SIZE]
    );
    journal.unmount().unwrap();
    let (_, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.clean);
}

// An item changed many times between checkpoints is written once; sync mode writes each time.
#[test]
fn relogging_writes_once_and_sync_mode_does_not_aggregate() {
    let mut bytes = Vec::new();
    for mode in [LogMode::Delayed, LogMode::Sync] {
        let (device, sb) = make_fs(64 << 20, None);
        let (journal, _) = open(&device, &sb, quiet(mode));
        let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
        create_block(&mut tx, &sb, 0, 0);
        tx.commit().unwrap();
        for round in 0..100u32 {
            let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
            let guard = tx.get_buf(test_block(&sb, 0), &spec()).unwrap();
            guard
                .write(64 + (round as usize % 10) * 8, &round.to_le_bytes())
                .unwrap();
            let sequence = tx.commit().unwrap();
            if mode == LogMode::Sync {
                assert!(journal.durable_sequence() >= sequence);
            }
            journal.check_invariants();
        }
        journal.force_all().unwrap();
        let stats = journal.stats();
        match mode {
            LogMode::Delayed => {
                assert_eq!(stats.items_relogged, 100);
                assert_eq!(stats.checkpoints, 1);
            }
            LogMode::Sync => assert_eq!(stats.checkpoints, 101),
        }
        bytes.push(stats.log_bytes);
        journal.unmount().unwrap();
    }
    assert!(bytes[0] * 20 < bytes[1], "{bytes:?}");
}

fn root_inode_image(device: &MemDevice, sb: &cairn_format::Superblock) -> Vec<u8> {
    let g = &sb.geometry;
    let (block, offset) = g.inode_position(InodeNumber(sb.root_inode)).unwrap();
    let image = device.snapshot();
    let at = (block.0 * u64::from(g.block_size)) as usize + offset;
    image[at..at + g.inode_size as usize].to_vec()
}

// Logged inode images are recovered after a crash and written home by the AIL otherwise.
#[test]
fn inode_items_recover_and_write_home() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut image = root_inode_image(&device, &sb);
    image[200] ^= 0x5a;
    let mut tx = journal.begin(reservation(&sb, 0)).unwrap();
    tx.log_inode(InodeNumber(sb.root_inode), &image);
    journal.force(tx.commit().unwrap()).unwrap();
    let crashed = crash(&device);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert_eq!(report.items_replayed, 1, "{report:?}");
    assert_eq!(root_inode_image(&crashed, &sb)[200], image[200]);
    recovered.unmount().unwrap();
    journal.push_ail().unwrap();
    assert_eq!(journal.ail_len(), 0);
    assert_eq!(root_inode_image(&device, &sb)[200], image[200]);
    let spec = cairn_journal::inode_cluster_spec(sb.geometry.inode_size, UUID).unwrap();
    let (block, _) = sb
        .geometry
        .inode_position(InodeNumber(sb.root_inode))
        .unwrap();
    let raw = device.snapshot();
    let start = (block.0 * 4096) as usize;
    let ops = cairn_journal::inode_cluster_ops(512).unwrap();
    cairn_bufcache::BufferOps::verify_read(ops, &raw[start..start + 4096], block, &spec).unwrap();
    journal.unmount().unwrap();
}

// An intent without its done item is reported by recovery; a finished one is not. Both
// kinds: extent-free and refcount intents.
#[test]
fn unfinished_intents_are_reported_and_relogged() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let extents = [FreeExtent {
        start: FsBlock(5000),
        length: 8,
    }];
    let updates = [RefcountUpdate {
        op: RefcountOp::Increase,
        start: FsBlock(6000),
        length: 4,
    }];
    let mut tx = journal.begin(reservation(&sb, 0)).unwrap();
    let finished = tx.log_free_intent(&extents);
    let open_intent = tx.log_free_intent(&extents);
    let finished_refcount = tx.log_refcount_intent(&updates);
    let open_refcount = tx.log_refcount_intent(&updates);
    journal.force(tx.commit().unwrap()).unwrap();
    let mut tx = journal.begin(reservation(&sb, 0)).unwrap();
    tx.log_free_done(finished);
    tx.log_refcount_done(finished_refcount);
    journal.force(tx.commit().unwrap()).unwrap();
    assert_eq!(journal.pending_intents().len(), 2);
    journal.check_invariants();
    // The watchdog's report names what holds the tail: the open intent.
    journal.push_ail().unwrap();
    let report = journal.space_report();
    assert!(report.contains("oldest Intent"), "{report}");
    assert!(report.contains("intent of 1 extents"), "{report}");
    let crashed = crash(&device);
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    let pending = &report.unfinished_intents;
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0].id, open_intent);
    assert_eq!(pending[0].work, IntentWork::Free(extents.to_vec()));
    assert_eq!(pending[1].id, open_refcount);
    assert_eq!(pending[1].work, IntentWork::Refcount(updates.to_vec()));
    // Relogged: a second crash before the allocator finishes still reports them.
    let again = crash(&crashed);
    let mut tx = recovered.begin(reservation(&sb, 0)).unwrap();
    tx.log_free_done(open_intent);
    tx.log_refcount_done(open_refcount);
    recovered.force(tx.commit().unwrap()).unwrap();
    let (_, report) = open(&again, &sb, quiet(LogMode::Delayed));
    assert_eq!(report.unfinished_intents.len(), 2);
    recovered.unmount().unwrap();
    let (_, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.unfinished_intents.is_empty());
}

// Share (percent) of the log between its durable tail and its head.
fn log_used_percent(
    journal: &cairn_journal::Journal,
    superblock: &cairn_format::Superblock,
) -> u64 {
    let g = &superblock.geometry;
    let log_sectors = u64::from(g.log_blocks) * u64::from(g.block_size / 512);
    let (head, tail) = journal.head_and_tail();
    let cycles = u64::from(head.cycle() - tail.cycle());
    let used = cycles * log_sectors + u64::from(head.block()) - u64::from(tail.block());
    used * 100 / log_sectors
}

// The transaction finishing an intent never waits behind reservations that wait for the
// log's tail, which the open intent holds: with the log mostly full behind the intent, a
// large reservation waits; the finishing transaction starts anyway, and once its done item
// is logged the tail moves and the waiting reservation is granted.
#[test]
fn finishing_an_intent_never_waits_behind_the_tail_it_holds() {
    let (device, sb) = make_fs(64 << 20, Some(2 << 20));
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let extents = [FreeExtent {
        start: FsBlock(9000),
        length: 8,
    }];
    let mut tx = journal.begin(reservation(&sb, 0)).unwrap();
    let intent = tx.log_free_intent(&extents);
    journal.force(tx.commit().unwrap()).unwrap();
    let mut index = 0;
    while log_used_percent(&journal, &sb) < 60 {
        let mut tx = journal.begin(reservation(&sb, 8)).unwrap();
        for _ in 0..8 {
            create_block(&mut tx, &sb, index, 1);
            index += 1;
        }
        journal.force(tx.commit().unwrap()).unwrap();
        journal.push_ail().unwrap();
    }
    let quarter = Reservation::new(u64::from(sb.geometry.log_blocks) * 4096 / 4);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| journal.begin(quarter).map(|tx| tx.cancel()));
        // Let the waiter queue first (the test passes either way; this is the hard order).
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut tx = journal.begin_finishing(reservation(&sb, 0)).unwrap();
        tx.log_free_done(intent);
        tx.commit().unwrap();
        waiter.join().unwrap().unwrap().unwrap();
    });
    assert!(journal.pending_intents().is_empty());
    journal.check_invariants();
}

/// The bytes granted, from the watchdog's report of the log's space.
fn granted(journal: &cairn_journal::Journal) -> u64 {
    let report = journal.space_report();
    let after = report
        .split("granted ")
        .nth(1)
        .expect("granted in the report");
    after.split(' ').next().unwrap().parse().unwrap()
}

// Intents finished in their own checkpoint (the done item removes both from the context)
// give back all the log space they were granted: the grant leaked the shrink of the
// context's charge, until no reservation fitted an empty log.
#[test]
fn intents_finished_in_their_checkpoint_leak_no_log_space() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    journal.force_all().unwrap();
    let before = granted(&journal);
    let extents = [FreeExtent {
        start: FsBlock(9000),
        length: 8,
    }];
    for _ in 0..50 {
        let mut tx = journal.begin(reservation(&sb, 0)).unwrap();
        let intent = tx.log_free_intent(&extents);
        tx.commit().unwrap();
        let mut tx = journal.begin_finishing(reservation(&sb, 0)).unwrap();
        tx.log_free_done(intent);
        tx.commit().unwrap();
    }
    journal.force_all().unwrap();
    assert_eq!(granted(&journal), before, "{}", journal.space_report());
    journal.check_invariants();
}

// A transaction gives back the buffers it read and did not change since a mark (an
// allocator's failed look at an AG), keeps the changed and new ones, and commits only those.
#[test]
fn unchanged_buffers_are_given_back_since_a_mark() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut tx = journal.begin(reservation(&sb, 3)).unwrap();
    for index in 0..3 {
        create_block(&mut tx, &sb, index, 1);
    }
    journal.force(tx.commit().unwrap()).unwrap();
    let mut tx = journal.begin(reservation(&sb, 3)).unwrap();
    tx.get_buf(test_block(&sb, 0), &spec())
        .unwrap()
        .write(HEADER_SIZE, &[2])
        .unwrap();
    let mark = tx.joined_count();
    tx.get_buf(test_block(&sb, 1), &spec()).unwrap();
    assert!(
        tx.release_unchanged_since(mark),
        "only an unchanged buffer after the mark"
    );
    assert!(tx.buf_mut(test_block(&sb, 1)).is_none());
    // Another transaction may lock it now (it would wait for this one otherwise).
    let (done, finished) = std::sync::mpsc::channel();
    let mut tx = Some(tx);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut other = journal.begin(reservation(&sb, 1)).unwrap();
            other.get_buf(test_block(&sb, 1), &spec()).unwrap();
            other.cancel().unwrap();
            done.send(()).unwrap();
        });
        if finished.recv_timeout(Duration::from_secs(60)).is_err() {
            drop(tx.take()); // lets the other thread finish, so the test fails, not hangs
        }
    });
    let mut tx = tx.expect("the given-back buffer was still locked");
    let mark = tx.joined_count();
    tx.get_buf(test_block(&sb, 1), &spec()).unwrap();
    tx.get_buf(test_block(&sb, 2), &spec())
        .unwrap()
        .write(HEADER_SIZE, &[3])
        .unwrap();
    assert!(!tx.release_unchanged_since(mark), "a changed buffer stays");
    assert!(
        tx.buf_mut(test_block(&sb, 0)).is_some(),
        "joined before the mark"
    );
    assert!(tx.buf_mut(test_block(&sb, 1)).is_none());
    assert!(tx.buf_mut(test_block(&sb, 2)).is_some());
    journal.force(tx.commit().unwrap()).unwrap();
    journal.check_invariants();
}

// A freed block's earlier images are never replayed over what the block holds later.
#[test]
fn freed_blocks_are_not_replayed() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    create_block(&mut tx, &sb, 0, 3);
    journal.force(tx.commit().unwrap()).unwrap();
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    tx.get_buf(test_block(&sb, 0), &spec()).unwrap();
    tx.invalidate_buf(test_block(&sb, 0)).unwrap();
    journal.force(tx.commit().unwrap()).unwrap();
    // The block is reused for file data, written in place.
    let data = cairn_blockdev::AlignedBuf::from_slice(&[0xee; 4096]);
    let at = test_block(&sb, 0).block.0 * 4096;
    cairn_blockdev::BlockDevice::write_at(device.as_ref(), at, &data).unwrap();
    cairn_blockdev::BlockDevice::flush(device.as_ref()).unwrap();
    let crashed = crash(&device);
    let (_, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.items_skipped >= 1, "{report:?}");
    assert_eq!(
        read_body(crashed.as_ref(), &sb, 0),
        vec![0xee; 4096 - HEADER_SIZE]
    );
    journal.unmount().unwrap();
}

// A small log wraps many times under space pressure without deadlock, and recovers.
#[test]
fn small_log_wraps_under_pressure() {
    for background in [false, true] {
        let (device, sb) = make_fs(64 << 20, Some(1 << 20));
        let config = cairn_journal::JournalConfig {
            background,
            ..quiet(LogMode::Delayed)
        };
        let (journal, _) = open(&device, &sb, config);
        for round in 0..400u64 {
            let mut tx = journal.begin(reservation(&sb, 4)).unwrap();
            for index in 0..4 {
                create_block(&mut tx, &sb, (round * 4 + index) % 64, round as u8);
            }
            let sequence = tx.commit().unwrap();
            if round % 7 == 0 {
                journal.force(sequence).unwrap();
            }
            journal.check_invariants();
        }
        journal.force_all().unwrap();
        let (head, _) = journal.head_and_tail();
        assert!(head.cycle() > 2, "log did not wrap: {head:?}");
        let crashed = crash(&device);
        drop(journal);
        // The wrapped log, read in pieces, needs recovery.
        assert!(cairn_journal::Journal::needs_recovery(crashed.as_ref(), &sb).unwrap());
        let (journal, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
        assert!(!report.clean);
        journal.unmount().unwrap();
        assert!(!cairn_journal::Journal::needs_recovery(crashed.as_ref(), &sb).unwrap());
        for index in 0..64u64 {
            let round = (399 / 16) * 16 + index / 4;
            let round = if round > 399 { round - 16 } else { round };
            assert_eq!(
                read_body(crashed.as_ref(), &sb, index)[0],
                round as u8,
                "block {index}"
            );
        }
    }
}

// Cancelling a clean transaction is fine; cancelling a dirty one shuts the journal down,
// and the journal keeps that first cause (what `cairn stats` shows) over later ones.
#[test]
fn dirty_cancel_shuts_down() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    let spec: ReadSpec = spec();
    assert!(tx.get_buf(test_block(&sb, 0), &spec).is_err());
    tx.cancel().unwrap();
    assert_eq!(journal.shutdown_reason(), None);
    let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
    create_block(&mut tx, &sb, 0, 1);
    assert!(matches!(tx.cancel(), Err(JournalError::Shutdown { .. })));
    assert!(matches!(
        journal.begin(reservation(&sb, 1)),
        Err(JournalError::Shutdown { .. })
    ));
    assert!(journal.force_all().is_err());
    assert_eq!(
        journal.shutdown_reason().as_deref(),
        Some("a dirty transaction was cancelled")
    );
    let too_big = Reservation::new(1 << 40);
    assert!(journal.begin(too_big).is_err());
}

// A force of a checkpoint whose transactions all order no data flushes the device once
// (after the commit record); one ordering transaction in the checkpoint brings back the
// flush before the commit record. Either way the force makes the change durable.
#[test]
fn checkpoints_ordering_no_data_flush_once() {
    let (device, sb) = make_fs(64 << 20, None);
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let mut tx = journal.begin(reservation(&sb, 2)).unwrap();
    create_block(&mut tx, &sb, 0, 1);
    create_block(&mut tx, &sb, 1, 1);
    journal.force(tx.commit().unwrap()).unwrap();
    let mut flushes = Vec::new();
    for ordering in [[false, false], [true, false], [false, true], [true, true]] {
        let before = device.flush_count();
        let mut sequence = None;
        for (index, orders) in ordering.into_iter().enumerate() {
            let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
            let guard = tx.get_buf(test_block(&sb, index as u64), &spec()).unwrap();
            guard.write(200, &[7; 8]).unwrap();
            if !orders {
                tx.orders_no_data();
            }
            sequence = Some(tx.commit().unwrap());
        }
        journal.force(sequence.unwrap()).unwrap();
        assert!(journal.durable_sequence() >= sequence.unwrap());
        flushes.push(device.flush_count() - before);
    }
    assert_eq!(flushes, [1, 2, 2, 2]);
    journal.unmount().unwrap();
}

// An idle log is covered by one marker record once its items are home, and then left
// alone: every timer tick used to write another marker, each moving the tail past the one
// before (a 4 KiB log write every 30 s for ever on an idle mount). A commit after that
// is checkpointed, written home and covered again, and recovers.
#[test]
fn an_idle_log_is_covered_once_then_left_alone() {
    let (device, sb) = make_fs(64 << 20, None);
    let config = JournalConfig {
        checkpoint_interval_ms: 5,
        ..JournalConfig::with_mode(LogMode::Delayed)
    };
    let (journal, _) = open(&device, &sb, config);
    // Waits until the commit is durable, written home, and a marker followed the push.
    let settle = |journal: &cairn_journal::Journal, sequence, markers| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while journal.durable_sequence() < sequence
            || journal.ail_len() > 0
            || journal.stats().marker_records <= markers
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the log never settled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // A few more ticks, in which a marker that did not cover the log yet is followed
        // by one that does.
        std::thread::sleep(Duration::from_millis(50));
    };
    for round in 0..2u8 {
        let markers = journal.stats().marker_records;
        let mut tx = journal.begin(reservation(&sb, 1)).unwrap();
        create_block(&mut tx, &sb, 0, round + 1);
        let sequence = tx.commit().unwrap();
        settle(&journal, sequence, markers);
        let (writes, markers) = (device.stats().writes, journal.stats().marker_records);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(device.stats().writes, writes, "an idle log was written");
        assert_eq!(journal.stats().marker_records, markers);
        journal.check_invariants();
    }
    drop(journal);
    let crashed = crash(&device);
    let (journal, _) = open(&crashed, &sb, quiet(LogMode::Delayed));
    journal.unmount().unwrap();
    assert_eq!(
        read_body(crashed.as_ref(), &sb, 0),
        vec![2; 4096 - HEADER_SIZE]
    );
}
