//! The committed item list: the current checkpoint context, holding the latest log vector of
//! every item committed since the last push. Relogging an item replaces its vector, so an item
//! changed N times between checkpoints is written once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Instant;

use cairn_bufcache::{BufGuard, ReadSpec};
use cairn_format::InodeNumber;
use cairn_format::log::InodeCreate;

use crate::item::{
    BufferVector, IntentId, IntentKind, IntentWork, ItemKey, Vector, copy_regions, merge_regions,
};
use crate::reservation::checkpoint_bytes_max;

/// One checkpoint context: the items of the commits it gathered.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) sequence: u64,
    pub(crate) items: BTreeMap<ItemKey, Vector>,
    /// Sum of the vectors' encoded sizes.
    pub(crate) items_bytes: u64,
    pub(crate) commits: u64,
    /// When its first commit arrived: how long the oldest change not yet in a checkpoint
    /// has waited (the filesystem's commit window forces the log by it).
    pub(crate) first_commit_at: Option<Instant>,
    /// Whether a transaction in it orders earlier device writes: then the device is flushed
    /// between its data records and its commit record.
    pub(crate) orders_data: bool,
}

impl Context {
    pub(crate) fn new(sequence: u64) -> Self {
        Self {
            sequence,
            items: BTreeMap::new(),
            items_bytes: 0,
            commits: 0,
            first_commit_at: None,
            orders_data: false,
        }
    }

    /// Log bytes this context may take when written (see `checkpoint_bytes_max`).
    pub(crate) fn charge(&self, block_size: u64) -> u64 {
        checkpoint_bytes_max(self.items_bytes, block_size)
    }
}

/// What one buffer contributes at commit.
#[derive(Debug)]
pub(crate) struct BufferCommit<'a, 'g> {
    pub(crate) guard: &'a BufGuard<'g>,
    pub(crate) spec: ReadSpec,
    pub(crate) ranges: Vec<Range<usize>>,
    /// Freed and then created again inside the committing transaction.
    pub(crate) recreated: bool,
    /// Created as a new inode cluster, logged by this item instead of its bytes.
    pub(crate) create: Option<InodeCreate>,
}

/// The CIL; see the module documentation. Callers hold the journal's CIL lock.
#[derive(Debug)]
pub struct Cil {
    pub(crate) current: Context,
}

impl Cil {
    pub(crate) fn new(sequence: u64) -> Self {
        Self {
            current: Context::new(sequence),
        }
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.current.sequence
    }

    /// Detaches the current context and installs an empty one with the next sequence.
    pub(crate) fn switch(&mut self) -> Context {
        let next = Context::new(self.current.sequence + 1);
        std::mem::replace(&mut self.current, next)
    }

    fn replace(&mut self, key: ItemKey, vector: Vector) -> bool {
        let added = vector.encoded_bytes();
        let old = self.current.items.insert(key, vector);
        let removed = old.as_ref().map_or(0, Vector::encoded_bytes);
        self.current.items_bytes = self.current.items_bytes + added - removed;
        old.is_some()
    }

    /// Formats a buffer's changes into its vector, merging with an earlier copy in this
    /// context; pins the buffer when it enters the context (or a new buffer object replaces a
    /// freed one). Returns whether an earlier copy was replaced (a relog).
    pub(crate) fn insert_buffer(&mut self, commit: BufferCommit<'_, '_>) -> bool {
        let guard = commit.guard;
        let key = ItemKey::Buffer(guard.block());
        let stale = guard.is_stale();
        let old = match self.current.items.get(&key) {
            Some(Vector::Buffer(old)) => Some(old.clone()),
            _ => None,
        };
        let needs_pin = match &old {
            None => true,
            Some(old) => old.pinned.last().is_none_or(|h| h.is_stale()) && !stale,
        };
        let mut vector = old.unwrap_or_else(|| BufferVector {
            key: guard.key(),
            spec: commit.spec,
            len_bytes: guard.len() as u32,
            cancel_first: false,
            create: None,
            regions: Vec::new(),
            data: Vec::new(),
            pinned: Vec::new(),
        });
        if needs_pin {
            guard.pin();
            vector.pinned.push(guard.handle());
        }
        if stale {
            vector.cancel_first = true;
            vector.create = None;
            vector.regions.clear();
        } else {
            if commit.recreated {
                vector.create = None;
            }
            if commit.create.is_some() {
                vector.create = commit.create;
            }
            let base: &[(u32, u32)] = if commit.recreated {
                &[]
            } else {
                &vector.regions
            };
            vector.cancel_first |= commit.recreated;
            vector.regions = merge_regions(base, &commit.ranges);
        }
        vector.key = guard.key();
        vector.spec = commit.spec;
        vector.len_bytes = guard.len() as u32;
        vector.data = copy_regions(guard, &vector.regions);
        self.replace(key, Vector::Buffer(vector))
    }

    /// Logs an inode image, replacing an earlier image in this context.
    pub(crate) fn insert_inode(&mut self, inode: InodeNumber, image: Vec<u8>) -> bool {
        self.replace(ItemKey::Inode(inode), Vector::Inode { image })
    }

    pub(crate) fn insert_intent(&mut self, id: IntentId, work: IntentWork) {
        self.replace(ItemKey::Intent(id), Vector::Intent { work });
    }

    /// Logs a done item. When its intent is still in this context both vanish: the work and
    /// its intent reach the log in the same checkpoint, so recovery never needs the intent.
    pub(crate) fn insert_done(&mut self, id: IntentId, kind: IntentKind) {
        let key = ItemKey::Intent(id);
        if let Some(Vector::Intent { .. }) = self.current.items.get(&key) {
            if let Some(old) = self.current.items.remove(&key) {
                self.current.items_bytes -= old.encoded_bytes();
            }
            return;
        }
        self.replace(key, Vector::Done { kind });
    }

    /// Checks the accounting and every vector's shape; panics (in tests) on a violation.
    pub fn check_invariants(&self) {
        let sum: u64 = self.current.items.values().map(Vector::encoded_bytes).sum();
        assert_eq!(sum, self.current.items_bytes, "CIL byte count");
        for (key, vector) in &self.current.items {
            let kind_matches = matches!(
                (key, vector),
                (ItemKey::Buffer(_), Vector::Buffer(_))
                    | (ItemKey::Inode(_), Vector::Inode { .. })
                    | (
                        ItemKey::Intent(_),
                        Vector::Intent { .. } | Vector::Done { .. }
                    )
            );
            assert!(kind_matches, "CIL entry of the wrong kind: {key:?}");
            match (key, vector) {
                (ItemKey::Buffer(block), Vector::Buffer(buffer)) => {
                    assert_eq!(*block, buffer.key.block, "CIL buffer key");
                    assert!(!buffer.pinned.is_empty(), "CIL buffer not pinned");
                    if let Some(create) = buffer.create {
                        assert_eq!(create.block_bytes, buffer.len_bytes, "inode create size");
                    }
                    check_regions(buffer);
                }
                (_, Vector::Inode { image }) => assert!(!image.is_empty(), "empty inode image"),
                _ => {}
            }
        }
    }
}

fn check_regions(buffer: &BufferVector) {
    let mut next_free = 0u64;
    for &(offset, length) in &buffer.regions {
        assert!(length > 0, "empty region");
        assert!(u64::from(offset) >= next_free, "regions out of order");
        next_free = u64::from(offset) + u64::from(length);
        assert!(
            next_free <= u64::from(buffer.len_bytes),
            "region past the buffer"
        );
    }
    let data: u64 = buffer.regions.iter().map(|r| u64::from(r.1)).sum();
    assert_eq!(data, buffer.data.len() as u64, "region data length");
}
