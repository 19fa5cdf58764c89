//! Phase 0 of repair: the log. A dirty log is replayed by mounting and unmounting through
//! cairn-fs (the one recovery implementation). A log that cannot be read or replayed is
//! discarded with `-y`: replaced by a clean log whose one record, an unmount record, carries
//! an LSN above every LSN a metadata block or inode on the device carries. A zeroed log would
//! not do: the journal would restart at cycle 1, and recovery skips a logged change whenever
//! the home copy's LSN is as new or newer, so changes logged after the mount could be lost.

use std::sync::Arc;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};
use cairn_bufcache::{BufferCache, CacheConfig};
use cairn_format::header::block_crc;
use cairn_format::log::{LOG_FLAG_UNMOUNT, LogRecordHeader, encode_log_record};
use cairn_format::ondisk::get_u32;
use cairn_format::{FsBlock, Geometry, Lsn, MetaHeader, MetaKind, OnDisk, Superblock};
use cairn_journal::{Journal, JournalConfig, JournalError};

use super::{Mode, Outcome, RepairOptions};
use crate::FsckError;
use crate::log_check::show_lsn;
use crate::probe::{self, Opened};

/// Bytes read at a time by the scan for the highest metadata LSN.
const SCAN_BYTES: u64 = 8 << 20;

/// Replays a dirty log through cairn-fs (mount, then unmount) and reopens the device. If the
/// mount fails, the log is replayed through the journal alone (the same recovery, without
/// what cairn-fs reads after it: AG headers, the root inode, unlinked lists), since the
/// failure may not be the log's. A log that cannot be read or replayed is discarded in `-y`
/// mode (see the module comment) and left in preen mode; a replay that fails for another
/// reason (a device error writing home) keeps the log unless `-L` was given. Returns the
/// reopened device and whether repair may go on (false: a dirty log is left, and a later
/// replay over repaired metadata could undo the repairs).
pub(crate) fn settle_log(
    path: &std::path::Path,
    buffered: bool,
    opened: Opened,
    sb: &Superblock,
    options: RepairOptions,
    outcome: &mut Outcome,
) -> Result<(Opened, bool), FsckError> {
    let (failure, kept) = match Journal::needs_recovery(&opened.device, sb) {
        Ok(false) => {
            match crate::check::Checker::new(&opened.device, sb.clone()).head_record_fault() {
                None => return Ok((opened, true)),
                Some(fault) => (ReplayFailure::OfLog(fault), Some(opened)),
            }
        }
        Ok(true) => {
            let Opened { device, .. } = opened;
            let device: Arc<dyn BlockDevice> = Arc::new(device);
            match replay(device, sb, outcome) {
                Ok(()) => return Ok((probe::open_writable(path, buffered)?, true)),
                Err(failure) => (failure, None),
            }
        }
        Err(err) => (
            ReplayFailure::OfLog(format!("cannot be read ({err})")),
            Some(opened),
        ),
    };
    // The replay dropped the device (cairn-fs held it): open it again.
    let opened = match kept {
        Some(opened) => opened,
        None => probe::open_writable(path, buffered)?,
    };
    let failure = match failure {
        ReplayFailure::OfLog(failure) if options.mode != Mode::Yes => {
            outcome.skipped.push(format!(
                "log: {failure}; discarding it loses the changes it holds: not repaired in \
                 preen mode (run with -y)"
            ));
            return Ok((opened, false));
        }
        ReplayFailure::Elsewhere(failure) if !options.discard_log => {
            outcome.skipped.push(format!(
                "log: {failure}; the log is kept (its changes are not lost): fix the cause \
                 and run fsck.cairn again, or run with -L to discard the log and LOSE them"
            ));
            return Ok((opened, false));
        }
        ReplayFailure::OfLog(failure) | ReplayFailure::Elsewhere(failure) => failure,
    };
    let lsn = discard_log(&opened.device, sb)?;
    let warning = format!(
        "log: {failure}; DISCARDED: the changes it held that were not yet written home are \
         LOST; a clean log starts at LSN {}",
        show_lsn(lsn)
    );
    outcome.warnings.push(warning.clone());
    outcome.actions.push(warning);
    Ok((opened, true))
}

/// Why a dirty log could not be replayed.
#[derive(Debug)]
enum ReplayFailure {
    /// The log itself: unreadable, records that do not decode, items that do not fit.
    OfLog(String),
    /// Something else (the device, while replay wrote home): the log may be sound.
    Elsewhere(String),
}

/// Replays the log: through cairn-fs, or through the journal alone if mounting fails.
fn replay(
    device: Arc<dyn BlockDevice>,
    sb: &Superblock,
    outcome: &mut Outcome,
) -> Result<(), ReplayFailure> {
    let options = cairn_fs::MountOptions::default();
    let mounted = cairn_fs::Filesystem::mount(Arc::clone(&device), options);
    let mount_error = match mounted.and_then(|fs| fs.unmount()) {
        Ok(()) => {
            let done = "log: replayed the checkpoints it held".to_string();
            outcome.actions.push(done);
            return Ok(());
        }
        Err(err) => err,
    };
    match replay_journal_only(device, sb) {
        Ok(report) => {
            outcome.actions.push(format!(
                "log: replayed the checkpoints it held through the journal alone (mounting \
                 failed: {mount_error}); {} unfinished extent-free intents left to the space \
                 phase",
                report.unfinished_intents.len()
            ));
            Ok(())
        }
        Err(err) if is_log_fault(&err) => Err(ReplayFailure::OfLog(format!(
            "replay failed (mounting: {mount_error}; the journal alone: {err})"
        ))),
        Err(err) => Err(ReplayFailure::Elsewhere(format!(
            "replay failed for a reason that is not the log's (mounting: {mount_error}; the \
             journal alone: {err})"
        ))),
    }
}

/// Opens the journal alone (running recovery) and closes it. Extent-free intents left
/// unfinished keep a log dirty on purpose; once the checkpoints are home that log holds
/// nothing else, and the space phase frees whatever no inode claims, so it is replaced by a
/// clean log.
fn replay_journal_only(
    device: Arc<dyn BlockDevice>,
    sb: &Superblock,
) -> Result<cairn_journal::RecoveryReport, JournalError> {
    let cache_config = CacheConfig::from_geometry(&sb.geometry);
    let cache = Arc::new(BufferCache::new(cache_config, Arc::clone(&device))?);
    let config = JournalConfig {
        inode_cluster_blocks: 1,
        ..JournalConfig::default()
    };
    let (journal, report) = Journal::open(cache, Arc::clone(&device), sb, config)?;
    journal.unmount()?;
    if Journal::needs_recovery(device.as_ref(), sb)? {
        discard_log(device.as_ref(), sb).map_err(|source| JournalError::Device {
            what: "recovery write",
            offset: 0,
            source,
        })?;
    }
    Ok(report)
}

/// Whether a journal error is the log's own (unreadable, corrupt records, items that do not
/// fit the filesystem) rather than the device's or the metadata's.
fn is_log_fault(err: &JournalError) -> bool {
    match err {
        JournalError::CorruptLog { .. } | JournalError::BadItem { .. } => true,
        JournalError::Device { what, .. } => *what == "log read",
        _ => false,
    }
}

/// Replaces the log with a clean one (a single unmount record) whose LSN is above every LSN
/// found in a metadata block or inode of the device; returns that LSN.
pub(crate) fn discard_log(device: &dyn BlockDevice, sb: &Superblock) -> Result<Lsn, DeviceError> {
    let g = sb.geometry;
    let newest = newest_metadata_lsn(device, &g, sb.uuid())?;
    // A new cycle at log block 0: above every LSN of an earlier cycle.
    let lsn = Lsn::new(newest.cycle().saturating_add(1).max(1), 0);
    let header = LogRecordHeader {
        header_crc: 0,
        cycle: lsn.cycle(),
        flags: LOG_FLAG_UNMOUNT,
        lsn,
        prev_lsn: Lsn::ZERO,
        checkpoint_sequence: 0,
        payload_bytes: 0,
        payload_crc: 0,
        op_count: 0,
        uuid: sb.uuid(),
        tail_lsn: lsn,
    };
    let record = encode_log_record(&header, &[]);
    let start = g.byte_offset(FsBlock(g.log_start));
    let block_size = g.block_size as usize;
    device.write_zeroes(start, u64::from(g.log_blocks) * block_size as u64)?;
    let mut block = AlignedBuf::zeroed(block_size);
    block[..record.len()].copy_from_slice(&record);
    device.write_at(start, &block)?;
    device.flush()?;
    Ok(lsn)
}

/// The highest LSN carried by any block or inode of the device whose header verifies (magic,
/// CRC) and names this filesystem. The whole device is read: a block no structure reaches
/// still carries its LSN, and recovery would compare against it if it were reused.
pub(crate) fn newest_metadata_lsn(
    device: &dyn BlockDevice,
    g: &Geometry,
    uuid: [u8; 16],
) -> Result<Lsn, DeviceError> {
    let block_size = u64::from(g.block_size);
    let total = g.block_count * block_size;
    let chunk = SCAN_BYTES.next_multiple_of(block_size);
    let mut buf = AlignedBuf::zeroed(chunk as usize);
    let mut newest = Lsn::ZERO;
    let mut offset = 0;
    while offset < total {
        let len = chunk.min(total - offset) as usize;
        if len < buf.len() {
            buf = AlignedBuf::zeroed(len);
        }
        device.read_at(offset, &mut buf)?;
        for block in buf.chunks_exact(block_size as usize) {
            newest = newest.max(block_newest_lsn(block, g.inode_size as usize, &uuid));
        }
        offset += len as u64;
    }
    Ok(newest)
}

/// The highest verified LSN in one block: its own header, or each inode's in an inode block.
fn block_newest_lsn(block: &[u8], inode_size: usize, uuid: &[u8; 16]) -> Lsn {
    let verified = |piece: &[u8]| {
        let header = MetaHeader::decode(piece).ok()?;
        (header.uuid == *uuid && header.crc == block_crc(piece)).then_some(header.lsn)
    };
    match MetaKind::from_magic(get_u32(block, 0)) {
        Some(kind) if kind != MetaKind::Inode => verified(block).unwrap_or(Lsn::ZERO),
        // An inode block (its first inode may be the damaged one) or not metadata at all.
        _ => block
            .chunks_exact(inode_size)
            .filter(|piece| MetaKind::from_magic(get_u32(piece, 0)) == Some(MetaKind::Inode))
            .filter_map(verified)
            .max()
            .unwrap_or(Lsn::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::DeviceError;

    // Only a log that cannot be read or whose records or items are bad is the log's fault.
    #[test]
    fn log_faults_are_told_from_others() {
        let io = || DeviceError::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        let corrupt = JournalError::CorruptLog {
            lsn: Lsn::ZERO,
            why: "torn".into(),
        };
        let item = JournalError::BadItem {
            what: "buffer".into(),
            why: "past the device",
        };
        let device = |what| JournalError::Device {
            what,
            offset: 0,
            source: io(),
        };
        let (log_read, home_write) = (device("log read"), device("recovery write"));
        assert!(is_log_fault(&corrupt) && is_log_fault(&item) && is_log_fault(&log_read));
        assert!(!is_log_fault(&home_write));
    }
}
