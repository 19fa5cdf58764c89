//! Recovery reads the log through a bounded window and writes replayed blocks home whenever
//! it holds more than its limit (an eighth of the log here): a log whose checkpoints touch
//! many more blocks than that replays to exactly what was committed, blocks changed in
//! several checkpoints and blocks freed after their last image included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::HEADER_SIZE;
use cairn_journal::{LogMode, Reservation};
use common::*;

const BLOCKS: u64 = 150;

// 150 blocks (600 KiB, against a 256 KiB replay limit on a 2 MiB log) created in three
// checkpoints, half of them rewritten in a fourth and two invalidated; crash before any is
// written home; recovery restores every committed body.
#[test]
fn replay_larger_than_its_memory_limit() {
    let (device, sb) = make_fs(64 << 20, Some(2 << 20));
    let (journal, _) = open(&device, &sb, quiet(LogMode::Delayed));
    let g = &sb.geometry;
    let reserve = |buffers| Reservation::for_items(g, buffers, g.block_size, 0, 0);
    for part in 0..3 {
        let mut tx = journal.begin(reserve(50)).unwrap();
        for index in part * 50..(part + 1) * 50 {
            create_block(&mut tx, &sb, index, index as u8);
        }
        let sequence = tx.commit().unwrap();
        journal.force(sequence).unwrap();
    }
    let mut tx = journal.begin(reserve(80)).unwrap();
    for index in (0..BLOCKS).step_by(2) {
        let guard = tx.get_buf(test_block(&sb, index), &spec()).unwrap();
        guard.write(HEADER_SIZE + 7, &[0xee; 9]).unwrap();
    }
    for index in [3, 5] {
        tx.get_buf(test_block(&sb, index), &spec()).unwrap();
        tx.invalidate_buf(test_block(&sb, index)).unwrap();
    }
    let sequence = tx.commit().unwrap();
    journal.force(sequence).unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), SECTOR).unwrap());
    drop(journal);
    let (journal, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.checkpoints_replayed >= 4, "{report:?}");
    assert!(
        report.blocks_written > BLOCKS,
        "{report:?}: written back mid-replay"
    );
    for index in (0..BLOCKS).filter(|i| ![3, 5].contains(i)) {
        let mut want = vec![index as u8; 4096 - HEADER_SIZE];
        if index % 2 == 0 {
            want[7..16].fill(0xee);
        }
        assert!(
            read_body(crashed.as_ref(), &sb, index) == want,
            "block {index}"
        );
    }
    journal.unmount().unwrap();
}
