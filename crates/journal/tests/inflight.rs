//! Several checkpoints in flight: with device flushes held back, later pushes write their data
//! records while earlier checkpoints wait for their flushes, up to
//! `CHECKPOINTS_IN_FLIGHT_MAX`; commit records still reach the log in sequence order, and a
//! crash after the last force recovers every commit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError, MemDevice};
use cairn_bufcache::{BufferCache, CacheConfig};
use cairn_format::{HEADER_SIZE, Superblock};
use cairn_journal::{CHECKPOINTS_IN_FLIGHT_MAX, CommitSequence, Journal, LogMode, Reservation};
use common::*;
use parking_lot::{Condvar, Mutex};

/// Whether flushes are held, and how many callers are held.
#[derive(Debug, Default)]
struct Gate {
    closed: bool,
    waiting: usize,
}

/// A memory device whose flushes wait while its gate is closed.
#[derive(Debug)]
struct GatedDevice {
    inner: Arc<MemDevice>,
    gate: Mutex<Gate>,
    changed: Condvar,
}

impl GatedDevice {
    fn set_closed(&self, closed: bool) {
        self.gate.lock().closed = closed;
        self.changed.notify_all();
    }

    fn wait_for_waiters(&self, count: usize) {
        let mut gate = self.gate.lock();
        while gate.waiting < count {
            self.changed.wait_for(&mut gate, Duration::from_millis(5));
        }
    }
}

impl BlockDevice for GatedDevice {
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        let mut gate = self.gate.lock();
        if gate.closed {
            gate.waiting += 1;
            self.changed.notify_all();
            while gate.closed {
                self.changed.wait(&mut gate);
            }
            gate.waiting -= 1;
        }
        drop(gate);
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.inner.discard(offset, len)
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_sector_size(&self) -> u32 {
        self.inner.logical_sector_size()
    }
    fn physical_sector_size(&self) -> u32 {
        self.inner.physical_sector_size()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
}

fn open_gated(gated: &Arc<GatedDevice>, superblock: &Superblock) -> Journal {
    let device: Arc<dyn BlockDevice> = gated.clone();
    let cache_config = CacheConfig::from_geometry(&superblock.geometry);
    let cache = Arc::new(BufferCache::new(cache_config, Arc::clone(&device)).unwrap());
    Journal::open(cache, device, superblock, quiet(LogMode::Delayed))
        .unwrap()
        .0
}

/// Commits `value` into the body of test block `index`; returns its sequence.
fn change(journal: &Journal, sb: &Superblock, index: u64, value: u8) -> CommitSequence {
    let g = sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(&g, 1, g.block_size, 0, 0))
        .unwrap();
    let guard = tx.get_buf(test_block(sb, index), &spec()).unwrap();
    let len = guard.len();
    guard.bytes_mut(HEADER_SIZE..len).unwrap().fill(value);
    tx.commit().unwrap()
}

// Six forces from six threads with flushes held: four checkpoints write their data, the
// other two wait; released, the commit records come in sequence order after later data.
#[test]
fn later_checkpoints_write_while_earlier_commits_wait() {
    const PUSHES: u64 = 6;
    let (memory, sb) = make_fs(64 << 20, None);
    let gated = Arc::new(GatedDevice {
        inner: Arc::clone(&memory),
        gate: Mutex::new(Gate::default()),
        changed: Condvar::new(),
    });
    let journal = open_gated(&gated, &sb);
    let g = sb.geometry;
    let mut tx = journal
        .begin(Reservation::for_items(
            &g,
            PUSHES as u32,
            g.block_size,
            0,
            0,
        ))
        .unwrap();
    for index in 0..PUSHES {
        create_block(&mut tx, &sb, index, 0);
    }
    journal.force(tx.commit().unwrap()).unwrap();
    memory.clear_log();
    gated.set_closed(true);
    let mut sequences = Vec::new();
    std::thread::scope(|scope| {
        for index in 0..PUSHES {
            let sequence = change(&journal, &sb, index, index as u8 + 1);
            sequences.push(sequence.0);
            let journal = &journal;
            scope.spawn(move || journal.force(sequence).unwrap());
            while journal.current_sequence() <= sequence {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        gated.wait_for_waiters(CHECKPOINTS_IN_FLIGHT_MAX as usize);
        let seen = oplog::records(&memory.op_log(), &sb);
        assert!(
            seen.iter().all(|r| !r.commit),
            "a commit record before any flush"
        );
        let limit = sequences[0] + CHECKPOINTS_IN_FLIGHT_MAX;
        let written: std::collections::BTreeSet<u64> = seen.iter().map(|r| r.sequence).collect();
        let expected: std::collections::BTreeSet<u64> = (sequences[0]..limit).collect();
        assert_eq!(
            written, expected,
            "checkpoints with data written while flushes wait"
        );
        gated.set_closed(false);
    });
    journal.check_invariants();
    assert!(journal.durable_sequence().0 >= sequences[PUSHES as usize - 1]);
    let seen = oplog::records(&memory.op_log(), &sb);
    oplog::check_order(&seen, memory.flush_count(), true);
    let position = |sequence: u64, commit: bool| {
        seen.iter()
            .position(|r| r.sequence == sequence && r.commit == commit)
            .unwrap()
    };
    assert!(position(sequences[1], false) < position(sequences[0], true));
    let crashed = Arc::new(MemDevice::from_image(memory.durable_image(), SECTOR).unwrap());
    let (recovered, report) = open(&crashed, &sb, quiet(LogMode::Delayed));
    assert!(report.checkpoints_replayed >= PUSHES, "{report:?}");
    for index in 0..PUSHES {
        let body = read_body(crashed.as_ref(), &sb, index);
        assert!(body.iter().all(|&b| b == index as u8 + 1), "block {index}");
    }
    recovered.unmount().unwrap();
    journal.unmount().unwrap();
}
