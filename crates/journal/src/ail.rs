//! The active item list: items whose checkpoint is durable but whose home copy may not be,
//! ordered by the LSN of the checkpoint that last logged them. Its oldest entry bounds the
//! log tail.

use std::collections::{BTreeSet, HashMap};

use cairn_bufcache::{BufHandle, ReadSpec};
use cairn_format::Lsn;

use crate::item::{IntentWork, ItemKey};

/// What the AIL keeps of an item to write it home.
#[derive(Debug, Clone)]
pub(crate) enum AilItem {
    /// A buffer: written home through the buffer cache's delayed-write queue.
    Buffer { handle: BufHandle, spec: ReadSpec },
    /// A logical inode: its latest durable image, copied into its cluster buffer on push.
    /// `flushed` names the cluster buffer and the `version` copied, once copied.
    Inode {
        image: Vec<u8>,
        version: u64,
        flushed: Option<(BufHandle, u64)>,
    },
    /// An intent: stays until its done item is durable.
    Intent { work: IntentWork },
}

/// The AIL; callers hold the journal's AIL lock.
#[derive(Debug, Default)]
pub struct Ail {
    by_lsn: BTreeSet<(Lsn, ItemKey)>,
    items: HashMap<ItemKey, (Lsn, AilItem)>,
    next_version: u64,
}

impl Ail {
    /// Inserts `item` at `lsn`, moving it if it was in the AIL at an older LSN.
    pub(crate) fn insert(&mut self, key: ItemKey, lsn: Lsn, mut item: AilItem) {
        if let AilItem::Inode { version, .. } = &mut item {
            self.next_version += 1;
            *version = self.next_version;
        }
        if let Some((old_lsn, _)) = self.items.insert(key, (lsn, item)) {
            self.by_lsn.remove(&(old_lsn, key));
        }
        self.by_lsn.insert((lsn, key));
    }

    /// Inserts a buffer item at `lsn`, or keeps it at its older LSN if it is there already:
    /// a buffer's log vector holds only the regions changed in its checkpoint, so the older
    /// checkpoint is still needed until the buffer is written home.
    pub(crate) fn insert_keep_oldest(&mut self, key: ItemKey, lsn: Lsn, item: AilItem) {
        let at = self.items.get(&key).map_or(lsn, |(old, _)| (*old).min(lsn));
        self.insert(key, at, item);
    }

    pub(crate) fn remove(&mut self, key: ItemKey) -> Option<(Lsn, AilItem)> {
        let removed = self.items.remove(&key)?;
        self.by_lsn.remove(&(removed.0, key));
        Some(removed)
    }

    pub(crate) fn get_mut(&mut self, key: ItemKey) -> Option<&mut (Lsn, AilItem)> {
        self.items.get_mut(&key)
    }

    /// The oldest item, described for a report of stuck requests: what holds the tail.
    pub(crate) fn describe_oldest(&self) -> String {
        let Some((lsn, key)) = self.by_lsn.first() else {
            return "empty".to_string();
        };
        let state = match self.items.get(key).map(|(_, item)| item) {
            Some(AilItem::Buffer { handle, .. }) => format!(
                "buffer pinned {} dirty {} stale {}",
                handle.pin_count(),
                handle.is_dirty(),
                handle.is_stale()
            ),
            Some(AilItem::Inode {
                version, flushed, ..
            }) => format!(
                "inode version {version} copied {:?}",
                flushed
                    .as_ref()
                    .map(|(handle, copied)| (*copied, handle.is_dirty()))
            ),
            Some(AilItem::Intent { work }) => format!("intent of {} extents", work.len()),
            None => "missing".to_string(),
        };
        format!("{key:?} at {lsn:?}: {state}")
    }

    /// The oldest LSN in the AIL: the log tail may not pass it.
    pub fn min_lsn(&self) -> Option<Lsn> {
        self.by_lsn.first().map(|(lsn, _)| *lsn)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items with LSN at most `target`, oldest first (cloned, so no lock is held while they
    /// are pushed).
    pub(crate) fn up_to(&self, target: Lsn) -> Vec<(ItemKey, Lsn, AilItem)> {
        self.by_lsn
            .iter()
            .take_while(|(lsn, _)| *lsn <= target)
            .filter_map(|(lsn, key)| {
                self.items
                    .get(key)
                    .map(|(_, item)| (*key, *lsn, item.clone()))
            })
            .collect()
    }

    /// The intents in the AIL, by id.
    pub(crate) fn intents(&self) -> Vec<crate::PendingIntent> {
        let mut intents: Vec<crate::PendingIntent> = self
            .items
            .iter()
            .filter_map(|(key, (_, item))| match (key, item) {
                (ItemKey::Intent(id), AilItem::Intent { work }) => Some(crate::PendingIntent {
                    id: *id,
                    work: work.clone(),
                }),
                _ => None,
            })
            .collect();
        intents.sort_by_key(|intent| intent.id);
        intents
    }

    /// Whether only intents remain (they leave with their done items, not by writeback).
    pub(crate) fn only_intents(&self) -> bool {
        self.items
            .keys()
            .all(|key| matches!(key, ItemKey::Intent(_)))
    }

    /// Checks that the LSN order and the item map describe the same entries, none newer than
    /// `head`.
    pub fn check_invariants(&self, head: Lsn) {
        assert_eq!(self.by_lsn.len(), self.items.len(), "AIL index sizes");
        for (lsn, key) in &self.by_lsn {
            let entry = self.items.get(key);
            assert_eq!(entry.map(|e| e.0), Some(*lsn), "AIL entry {key:?}");
            assert!(
                *lsn <= head,
                "AIL entry {key:?} at {lsn:?} past the head {head:?}"
            );
        }
    }
}
