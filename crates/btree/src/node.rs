//! Raw access to one tree block: node header fields, entries, and the in-place edits that
//! mark exactly the changed bytes dirty.

use std::ops::Range;

use cairn_bufcache::BufGuard;
use cairn_format::ondisk::{get_u16, get_u64, put_u16, put_u64};
use cairn_format::{BTREE_HEADER_SIZE, BtreeHeader, BtreeLayout, MetaHeader, OnDisk};

use crate::TreeError;

const LEVEL_AT: usize = 48;
const COUNT_AT: usize = 50;
const LEFT_AT: usize = 56;
const RIGHT_AT: usize = 64;

/// Largest record or key any tree kind stores (extent and inode records).
pub(crate) const ENTRY_BYTES_MAX: usize = 16;

/// The node header fields the tree walks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    pub level: u16,
    pub count: usize,
    pub left: u64,
    pub right: u64,
}

/// Reads the node header of `buf` (already verified by the buffer's read verifier or built by
/// the tree) and checks it against what the walker expects.
pub(crate) fn node(buf: &[u8], capacity: usize, block: u64) -> Result<Node, TreeError> {
    if buf.len() < BTREE_HEADER_SIZE {
        return Err(TreeError::corrupt(
            block,
            "block shorter than a node header",
        ));
    }
    let node = Node {
        level: get_u16(buf, LEVEL_AT),
        count: usize::from(get_u16(buf, COUNT_AT)),
        left: get_u64(buf, LEFT_AT),
        right: get_u64(buf, RIGHT_AT),
    };
    if node.count > capacity {
        let what = format!("{} entries, more than the capacity {capacity}", node.count);
        return Err(TreeError::corrupt(block, what));
    }
    Ok(node)
}

/// One leaf record or one node key with its child pointer, copied out of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    bytes: [u8; ENTRY_BYTES_MAX],
    len: u8,
    pub ptr: u64,
}

impl Entry {
    pub fn new(raw: &[u8], ptr: u64) -> Entry {
        let mut bytes = [0u8; ENTRY_BYTES_MAX];
        let len = raw.len().min(ENTRY_BYTES_MAX);
        bytes[..len].copy_from_slice(&raw[..len]);
        Entry {
            bytes,
            len: len as u8,
            ptr,
        }
    }

    pub fn encode<T: OnDisk>(value: &T, ptr: u64) -> Entry {
        let mut bytes = [0u8; ENTRY_BYTES_MAX];
        value.encode(&mut bytes[..T::SIZE]);
        Entry {
            bytes,
            len: T::SIZE as u8,
            ptr,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Where a level's entries live: records in leaves; keys then pointers in nodes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    pub layout: BtreeLayout,
    pub level: u16,
}

impl Slots {
    fn entry_size(&self) -> usize {
        if self.level == 0 {
            self.layout.record_size
        } else {
            self.layout.key_size
        }
    }

    /// Byte range of entries `range` in the record or key array.
    fn span(&self, range: Range<usize>) -> Range<usize> {
        let size = self.entry_size();
        BTREE_HEADER_SIZE + range.start * size..BTREE_HEADER_SIZE + range.end * size
    }

    /// Byte range of pointers `range` (nodes only).
    fn pointer_span(&self, range: Range<usize>) -> Range<usize> {
        let base = BTREE_HEADER_SIZE + self.layout.node_capacity() * self.layout.key_size;
        let size = self.layout.pointer_size;
        base + range.start * size..base + range.end * size
    }

    /// The raw record (leaf) or key (node) at `index`.
    pub fn raw<'a>(&self, buf: &'a [u8], index: usize) -> &'a [u8] {
        &buf[self.span(index..index + 1)]
    }

    pub fn pointer(&self, buf: &[u8], index: usize) -> u64 {
        self.layout.pointer(buf, index).unwrap_or(u64::MAX)
    }

    pub fn entry(&self, buf: &[u8], index: usize) -> Entry {
        let ptr = if self.level == 0 {
            0
        } else {
            self.pointer(buf, index)
        };
        Entry::new(self.raw(buf, index), ptr)
    }

    pub fn entries(&self, buf: &[u8], count: usize) -> Vec<Entry> {
        (0..count).map(|i| self.entry(buf, i)).collect()
    }

    /// Shifts entries `from..count` by one to the right and writes `entry` at `from`.
    pub fn insert(
        &self,
        guard: &mut BufGuard<'_>,
        from: usize,
        count: usize,
        entry: &Entry,
    ) -> Result<(), TreeError> {
        let block = guard.block().0;
        let span = self.span(from..count + 1);
        let size = self.entry_size();
        let bytes = guard.bytes_mut(span).map_err(range_error(block))?;
        bytes.copy_within(0..bytes.len() - size, size);
        bytes[..size].copy_from_slice(entry.bytes());
        if self.level > 0 {
            let span = self.pointer_span(from..count + 1);
            let psize = self.layout.pointer_size;
            let bytes = guard.bytes_mut(span).map_err(range_error(block))?;
            bytes.copy_within(0..bytes.len() - psize, psize);
            put_pointer(&mut bytes[..psize], entry.ptr)?;
        }
        set_count(guard, count + 1)
    }

    /// Removes the entry at `index` by shifting the later ones left.
    pub fn remove(
        &self,
        guard: &mut BufGuard<'_>,
        index: usize,
        count: usize,
    ) -> Result<(), TreeError> {
        let block = guard.block().0;
        let size = self.entry_size();
        if index + 1 < count {
            let bytes = guard
                .bytes_mut(self.span(index..count))
                .map_err(range_error(block))?;
            bytes.copy_within(size.., 0);
            if self.level > 0 {
                let psize = self.layout.pointer_size;
                let bytes = guard
                    .bytes_mut(self.pointer_span(index..count))
                    .map_err(range_error(block))?;
                bytes.copy_within(psize.., 0);
            }
        }
        set_count(guard, count - 1)
    }

    /// Overwrites the record or key at `index` (the pointer stays).
    pub fn set_raw(
        &self,
        guard: &mut BufGuard<'_>,
        index: usize,
        raw: &[u8],
    ) -> Result<(), TreeError> {
        let block = guard.block().0;
        let span = self.span(index..index + 1);
        if guard.get(span.clone()) == Some(raw) {
            return Ok(());
        }
        guard.write(span.start, raw).map_err(range_error(block))
    }

    /// Replaces all entries with `entries` and sets the count.
    pub fn write_all(&self, guard: &mut BufGuard<'_>, entries: &[Entry]) -> Result<(), TreeError> {
        let block = guard.block().0;
        let size = self.entry_size();
        let bytes = guard
            .bytes_mut(self.span(0..entries.len()))
            .map_err(range_error(block))?;
        for (chunk, entry) in bytes.chunks_exact_mut(size).zip(entries) {
            chunk.copy_from_slice(entry.bytes());
        }
        if self.level > 0 {
            let psize = self.layout.pointer_size;
            let bytes = guard
                .bytes_mut(self.pointer_span(0..entries.len()))
                .map_err(range_error(block))?;
            for (chunk, entry) in bytes.chunks_exact_mut(psize).zip(entries) {
                put_pointer(chunk, entry.ptr)?;
            }
        }
        set_count(guard, entries.len())
    }
}

fn put_pointer(out: &mut [u8], value: u64) -> Result<(), TreeError> {
    match out.len() {
        4 => {
            let narrow = u32::try_from(value).map_err(|_| TreeError::Spec {
                why: "pointer does not fit 4 bytes",
            })?;
            out.copy_from_slice(&narrow.to_le_bytes());
        }
        _ => put_u64(out, 0, value),
    }
    Ok(())
}

pub(crate) fn range_error(block: u64) -> impl Fn(cairn_bufcache::BufCacheError) -> TreeError {
    move |source| TreeError::Buffer { block, source }
}

pub(crate) fn set_count(guard: &mut BufGuard<'_>, count: usize) -> Result<(), TreeError> {
    let block = guard.block().0;
    let count = u16::try_from(count).map_err(|_| TreeError::corrupt(block, "count overflow"))?;
    let bytes = guard
        .bytes_mut(COUNT_AT..COUNT_AT + 2)
        .map_err(range_error(block))?;
    put_u16(bytes, 0, count);
    Ok(())
}

pub(crate) fn set_left(guard: &mut BufGuard<'_>, left: u64) -> Result<(), TreeError> {
    let block = guard.block().0;
    let bytes = guard
        .bytes_mut(LEFT_AT..LEFT_AT + 8)
        .map_err(range_error(block))?;
    put_u64(bytes, 0, left);
    Ok(())
}

pub(crate) fn set_right(guard: &mut BufGuard<'_>, right: u64) -> Result<(), TreeError> {
    let block = guard.block().0;
    let bytes = guard
        .bytes_mut(RIGHT_AT..RIGHT_AT + 8)
        .map_err(range_error(block))?;
    put_u64(bytes, 0, right);
    Ok(())
}

/// Writes a fresh node header (the block is new and zeroed).
pub(crate) fn init(
    guard: &mut BufGuard<'_>,
    header: MetaHeader,
    level: u16,
) -> Result<(), TreeError> {
    let block = guard.block().0;
    let fresh = BtreeHeader {
        header,
        level,
        record_count: 0,
        left: cairn_format::types::NULL_BLOCK,
        right: cairn_format::types::NULL_BLOCK,
    };
    let bytes = guard
        .bytes_mut(0..BTREE_HEADER_SIZE)
        .map_err(range_error(block))?;
    fresh.encode(bytes);
    Ok(())
}
