//! `cairn-db logprint`: every record in the log whose header and payload verify, in log order,
//! with its LSN, flags, checkpoint and a count of its items by type.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cairn_blockdev::AlignedBuf;
use cairn_format::FsBlock;
use cairn_format::log::{
    LOG_FLAG_COMMIT, LOG_FLAG_UNMOUNT, LogItem, decode_log_items, decode_log_record,
};

use crate::check::Checker;
use crate::log_check::show_lsn;

fn item_name(item: &LogItem) -> &'static str {
    match item {
        LogItem::Buffer { .. } => "buffer",
        LogItem::Inode { .. } => "inode",
        LogItem::ExtentFreeIntent { .. } => "free-intent",
        LogItem::ExtentFreeDone { .. } => "free-done",
        LogItem::CheckpointStart { .. } => "checkpoint-start",
        LogItem::CheckpointCommit { .. } => "checkpoint-commit",
        LogItem::InodeCreate { .. } => "inode-create",
        LogItem::RefcountIntent { .. } => "refcount-intent",
        LogItem::RefcountDone { .. } => "refcount-done",
        LogItem::ShiftIntent { .. } => "shift-intent",
        LogItem::ShiftDone { .. } => "shift-done",
    }
}

/// Lists the log's records.
pub(crate) fn logprint(checker: &mut Checker<'_>) -> String {
    let g = checker.geometry;
    let block_size = g.block_size as usize;
    let mut image = AlignedBuf::zeroed(g.log_blocks as usize * block_size);
    if let Err(err) = checker
        .device
        .read_at(g.byte_offset(FsBlock(g.log_start)), &mut image)
    {
        return format!("log unreadable: {err}\n");
    }
    let mut out = format!("log: {} blocks at block {}\n", g.log_blocks, g.log_start);
    let mut records = 0;
    let mut at = 0;
    while at < image.len() {
        let Ok((header, payload)) = decode_log_record(&image[at..]) else {
            at += block_size;
            continue;
        };
        records += 1;
        let mut flags = Vec::new();
        if header.flags & LOG_FLAG_COMMIT != 0 {
            flags.push("commit");
        }
        if header.flags & LOG_FLAG_UNMOUNT != 0 {
            flags.push("unmount");
        }
        let mut items: BTreeMap<&str, u64> = BTreeMap::new();
        for item in decode_log_items(payload, header.op_count).unwrap_or_default() {
            *items.entry(item_name(&item)).or_default() += 1;
        }
        let _ = writeln!(
            out,
            "block {}: lsn {} prev {} tail {} checkpoint {} [{}] {} bytes, items {items:?}",
            at / block_size,
            show_lsn(header.lsn),
            show_lsn(header.prev_lsn),
            show_lsn(header.tail_lsn),
            header.checkpoint_sequence,
            flags.join(","),
            header.payload_bytes,
        );
        let length = 512 + header.payload_bytes as usize;
        at += length.next_multiple_of(block_size);
    }
    let _ = writeln!(out, "{records} records");
    out
}
