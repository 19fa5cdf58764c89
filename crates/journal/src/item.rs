//! Log items as the CIL holds them (log vectors), their identities, sizes and encoding.

use std::ops::Range;

use cairn_bufcache::{BufHandle, BufKey, ReadSpec};
use cairn_format::OnDisk;
use cairn_format::log::{FreeExtent, InodeCreate, LogItem, RefcountUpdate, ShiftIntent};
use cairn_format::{FsBlock, InodeNumber};

use crate::JournalError;
use crate::config::{ITEM_HEADER_BYTES, VECTOR_REGIONS_MAX};

/// Identifies one intent (extent-free, refcount or shift) and its done item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IntentId(pub u64);

/// What an intent promises a later transaction will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentWork {
    /// Free these extents.
    Free(Vec<FreeExtent>),
    /// Apply these refcount updates (reflink).
    Refcount(Vec<RefcountUpdate>),
    /// Finish this collapse or insert range.
    Shift(ShiftIntent),
}

impl IntentWork {
    /// Extents, updates (or shifts) it names.
    pub fn len(&self) -> usize {
        match self {
            Self::Free(extents) => extents.len(),
            Self::Refcount(updates) => updates.len(),
            Self::Shift(_) => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which done item finishes an intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntentKind {
    Free,
    Refcount,
    Shift,
}

/// The checkpoint sequence a commit went into; forcing it makes that commit durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CommitSequence(pub u64);

/// What a log item describes; one CIL entry and one AIL entry per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ItemKey {
    Buffer(FsBlock),
    Inode(InodeNumber),
    Intent(IntentId),
}

/// A buffer's log vector: the union of its changed regions since it entered the context.
#[derive(Debug, Clone)]
pub(crate) struct BufferVector {
    pub(crate) key: BufKey,
    pub(crate) spec: ReadSpec,
    /// Length of the buffer in bytes.
    pub(crate) len_bytes: u32,
    /// The block was freed (in this context) before the regions below were logged.
    pub(crate) cancel_first: bool,
    /// A new inode cluster logged logically: its free inodes are not in `regions` (an
    /// ordered buffer, XFS's term: written home by the AIL, its content in this item).
    pub(crate) create: Option<InodeCreate>,
    pub(crate) regions: Vec<(u32, u32)>,
    pub(crate) data: Vec<u8>,
    /// Every buffer this vector pinned (one per buffer object; a freed and reallocated block
    /// has two). Unpinned when the checkpoint completes.
    pub(crate) pinned: Vec<BufHandle>,
}

/// A CIL entry's content.
#[derive(Debug, Clone)]
pub(crate) enum Vector {
    Buffer(BufferVector),
    Inode { image: Vec<u8> },
    Intent { work: IntentWork },
    Done { kind: IntentKind },
}

/// Encoded size of an inode create item.
pub(crate) const INODE_CREATE_ITEM_BYTES: u64 = ITEM_HEADER_BYTES + InodeCreate::SIZE as u64;

/// Bytes of an inode image worth logging: up to its last non-zero byte, rounded up to 8 (the
/// rest is zero and replay zero-fills it).
pub(crate) fn inode_used_bytes(image: &[u8]) -> usize {
    let used = image
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |last| last + 1);
    used.next_multiple_of(8).min(image.len())
}

/// Encoded size of a buffer item with `region_count` regions and `data_bytes` of data.
pub(crate) fn buffer_item_bytes(region_count: usize, data_bytes: usize) -> u64 {
    (ITEM_HEADER_BYTES + 8 + 8 * region_count as u64 + data_bytes as u64).next_multiple_of(8)
}

impl Vector {
    /// Bytes this vector takes in a checkpoint (a cancel record counts as an empty buffer item).
    pub(crate) fn encoded_bytes(&self) -> u64 {
        match self {
            Self::Buffer(buffer) => {
                let cancel = if buffer.cancel_first {
                    buffer_item_bytes(0, 0)
                } else {
                    0
                };
                let create = match buffer.create {
                    Some(_) => INODE_CREATE_ITEM_BYTES,
                    None => 0,
                };
                let body = match buffer.regions.is_empty() {
                    true => 0,
                    false => buffer_item_bytes(buffer.regions.len(), buffer.data.len()),
                };
                cancel + create + body
            }
            Self::Inode { image } => {
                (ITEM_HEADER_BYTES + inode_used_bytes(image) as u64).next_multiple_of(8)
            }
            Self::Intent {
                work: IntentWork::Free(extents),
            } => ITEM_HEADER_BYTES + 8 + 16 * extents.len() as u64,
            Self::Intent {
                work: IntentWork::Refcount(updates),
            } => ITEM_HEADER_BYTES + 8 + 16 * updates.len() as u64,
            Self::Intent {
                work: IntentWork::Shift(_),
            } => ITEM_HEADER_BYTES + ShiftIntent::SIZE as u64,
            Self::Done {
                kind: IntentKind::Free | IntentKind::Refcount,
            } => ITEM_HEADER_BYTES + 8,
            Self::Done {
                kind: IntentKind::Shift,
            } => ITEM_HEADER_BYTES,
        }
    }

    /// The format's items for this vector, in replay order.
    pub(crate) fn to_log_items(&self, key: ItemKey) -> Vec<LogItem> {
        match (self, key) {
            (Self::Buffer(buffer), _) => {
                let block = buffer.key.block;
                let block_bytes = buffer.len_bytes;
                let mut items = Vec::with_capacity(3);
                let ordered = buffer.create.is_some();
                if buffer.cancel_first || (buffer.regions.is_empty() && !ordered) {
                    items.push(LogItem::Buffer {
                        block,
                        block_bytes,
                        regions: Vec::new(),
                        data: Vec::new(),
                    });
                }
                // After the cancel (the block's earlier life) and before the regions (changes
                // made to the new cluster): replay applies them in this order.
                if let Some(create) = buffer.create {
                    items.push(LogItem::InodeCreate { block, create });
                }
                if !buffer.regions.is_empty() {
                    items.push(LogItem::Buffer {
                        block,
                        block_bytes,
                        regions: buffer.regions.clone(),
                        data: buffer.data.clone(),
                    });
                }
                items
            }
            (Self::Inode { image }, ItemKey::Inode(inode)) => vec![LogItem::Inode {
                inode: inode.0,
                image: image[..inode_used_bytes(image)].to_vec(),
            }],
            (Self::Intent { work }, ItemKey::Intent(id)) => vec![match work {
                IntentWork::Free(extents) => LogItem::ExtentFreeIntent {
                    intent_id: id.0,
                    extents: extents.clone(),
                },
                IntentWork::Refcount(updates) => LogItem::RefcountIntent {
                    intent_id: id.0,
                    updates: updates.clone(),
                },
                IntentWork::Shift(shift) => LogItem::ShiftIntent {
                    intent_id: id.0,
                    shift: *shift,
                },
            }],
            (Self::Done { kind }, ItemKey::Intent(id)) => vec![match kind {
                IntentKind::Free => LogItem::ExtentFreeDone {
                    intent_id: id.0,
                    extents: Vec::new(),
                },
                IntentKind::Refcount => LogItem::RefcountDone { intent_id: id.0 },
                IntentKind::Shift => LogItem::ShiftDone { intent_id: id.0 },
            }],
            _ => Vec::new(),
        }
    }
}

/// Merges `old` regions (from an earlier copy of this buffer in the same context) with the
/// newly dirtied `new` ranges: sorted, touching and overlapping ranges joined. More than
/// `VECTOR_REGIONS_MAX` regions collapse into one spanning region, which bounds the item size.
pub(crate) fn merge_regions(old: &[(u32, u32)], new: &[Range<usize>]) -> Vec<(u32, u32)> {
    let mut all: Vec<(u64, u64)> = old
        .iter()
        .map(|&(offset, length)| (u64::from(offset), u64::from(offset) + u64::from(length)))
        .chain(new.iter().map(|r| (r.start as u64, r.end as u64)))
        .filter(|(start, end)| start < end)
        .collect();
    all.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (start, end) in all {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    if merged.len() > VECTOR_REGIONS_MAX
        && let (Some(first), Some(last)) = (merged.first(), merged.last())
    {
        merged = vec![(first.0, last.1)];
    }
    merged
        .into_iter()
        .map(|(start, end)| (start as u32, (end - start) as u32))
        .collect()
}

/// Copies the bytes of `regions` out of `bytes`, concatenated.
pub(crate) fn copy_regions(bytes: &[u8], regions: &[(u32, u32)]) -> Vec<u8> {
    let total: usize = regions.iter().map(|r| r.1 as usize).sum();
    let mut data = Vec::with_capacity(total);
    for &(offset, length) in regions {
        data.extend_from_slice(&bytes[offset as usize..(offset + length) as usize]);
    }
    data
}

/// Encodes `items` onto `out`, naming the item on failure.
pub(crate) fn encode_items(items: &[LogItem], out: &mut Vec<u8>) -> Result<(), JournalError> {
    for item in items {
        item.encode(out).map_err(|source| JournalError::Encode {
            what: format!("{item:?}").chars().take(80).collect(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks region merging: overlap and touching join, many regions collapse to one span.
    #[test]
    fn regions_merge_and_collapse() {
        let merged = merge_regions(&[(0, 8), (100, 4)], &[4..12, 104..110, 200..201]);
        assert_eq!(merged, vec![(0, 12), (100, 10), (200, 1)]);
        let many: Vec<Range<usize>> = (0..100).map(|i| i * 10..i * 10 + 1).collect();
        assert_eq!(merge_regions(&[], &many), vec![(0, 991)]);
        assert_eq!(
            copy_regions(&[1, 2, 3, 4, 5], &[(0, 1), (3, 2)]),
            vec![1, 4, 5]
        );
    }

    // Checks the logged length of inode images: up to the last non-zero byte, rounded to 8.
    #[test]
    fn inode_images_lose_their_zero_tail() {
        let mut image = vec![0u8; 512];
        assert_eq!(inode_used_bytes(&image), 0);
        image[0] = 1;
        assert_eq!(inode_used_bytes(&image), 8);
        image[176] = 1;
        assert_eq!(inode_used_bytes(&image), 184);
        image[511] = 1;
        assert_eq!(inode_used_bytes(&image), 512);
        assert_eq!(inode_used_bytes(&[1, 0, 1]), 3);
    }
}
