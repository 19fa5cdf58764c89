//! The global reclaim list: inodes that own cached entries, least recently used first.
//!
//! A doubly linked list threaded through a slab of fixed-size chunks, so every operation the
//! shrinker and the insert path perform under the list lock is O(1) and never copies the list:
//! link at the tail, unlink anywhere, rotate the head to the tail. Chunks never move once
//! allocated; free slots are chained through their `next` field, so there is no side vector to
//! grow either. The list holds one `Arc` of each linked inode's tree and the tree remembers its
//! slot (`InodeTree::list_slot`, written only under the list lock).
//!
//! LRU order is kept lazily: a lookup only sets the inode's referenced flag (no lock), and the
//! shrinker, which rotates every inode it takes from the head to the tail, gives a referenced
//! inode a second trip round instead of scanning it. This is the list_lru + referenced-bit
//! scheme; an exact LRU would take a global lock on every lookup.

use crate::error::ExtCacheError;
use crate::inode::InodeTree;
use crate::limits::RECLAIM_CHUNK_SLOTS;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// "No slot": end of a chain, or an inode that is not on the list.
pub(crate) const NO_SLOT: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    prev: u32,
    next: u32,
    tree: Option<Arc<InodeTree>>,
}

#[derive(Debug)]
pub(crate) struct ReclaimList {
    chunks: Vec<Box<[Node]>>,
    free_head: u32,
    head: u32,
    tail: u32,
    len: usize,
}

impl ReclaimList {
    pub(crate) fn new() -> Self {
        ReclaimList {
            chunks: Vec::new(),
            free_head: NO_SLOT,
            head: NO_SLOT,
            tail: NO_SLOT,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated so far (linked or free).
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.len() * RECLAIM_CHUNK_SLOTS
    }

    fn node(&self, slot: u32) -> Option<&Node> {
        let slot = slot as usize;
        self.chunks
            .get(slot / RECLAIM_CHUNK_SLOTS)?
            .get(slot % RECLAIM_CHUNK_SLOTS)
    }

    fn node_mut(&mut self, slot: u32) -> Option<&mut Node> {
        let slot = slot as usize;
        self.chunks
            .get_mut(slot / RECLAIM_CHUNK_SLOTS)?
            .get_mut(slot % RECLAIM_CHUNK_SLOTS)
    }

    fn set_next(&mut self, slot: u32, next: u32) {
        match self.node_mut(slot) {
            Some(node) => node.next = next,
            None => self.head = next,
        }
    }

    fn set_prev(&mut self, slot: u32, prev: u32) {
        match self.node_mut(slot) {
            Some(node) => node.prev = prev,
            None => self.tail = prev,
        }
    }

    /// Takes a free slot, adding a chunk when none is left (the only allocation here: one
    /// chunk per `RECLAIM_CHUNK_SLOTS` inodes, and nothing is copied).
    fn allocate_slot(&mut self) -> Option<u32> {
        if self.free_head == NO_SLOT {
            let first = u32::try_from(self.capacity()).ok()?;
            let slots = u32::try_from(RECLAIM_CHUNK_SLOTS).ok()?;
            first.checked_add(slots).filter(|end| *end < NO_SLOT)?;
            let chunk = (0..slots)
                .map(|index| Node {
                    prev: NO_SLOT,
                    next: if index + 1 < slots {
                        first + index + 1
                    } else {
                        NO_SLOT
                    },
                    tree: None,
                })
                .collect::<Vec<_>>()
                .into_boxed_slice();
            self.chunks.push(chunk);
            self.free_head = first;
        }
        let slot = self.free_head;
        self.free_head = self.node(slot)?.next;
        Some(slot)
    }

    /// Links `tree` at the tail (most recently used end). Does nothing if it is already linked.
    /// Returns false only if the slab cannot grow (more than ~4 billion inodes).
    pub(crate) fn push_back(&mut self, tree: &Arc<InodeTree>) -> bool {
        if tree.list_slot.load(Ordering::Relaxed) != NO_SLOT {
            return true;
        }
        let Some(slot) = self.allocate_slot() else {
            return false;
        };
        let tail = self.tail;
        if let Some(node) = self.node_mut(slot) {
            node.prev = tail;
            node.next = NO_SLOT;
            node.tree = Some(Arc::clone(tree));
        }
        self.set_next(tail, slot);
        self.tail = slot;
        self.len += 1;
        tree.list_slot.store(slot, Ordering::Relaxed);
        true
    }

    /// Unlinks `tree` if it is linked, returning the list's reference so the caller can drop
    /// it after releasing the list lock.
    pub(crate) fn remove(&mut self, tree: &InodeTree) -> Option<Arc<InodeTree>> {
        let slot = tree.list_slot.load(Ordering::Relaxed);
        let node = self.node(slot)?;
        let linked = node
            .tree
            .as_ref()
            .is_some_and(|t| std::ptr::eq(Arc::as_ptr(t), tree));
        if !linked {
            return None;
        }
        let (prev, next) = (node.prev, node.next);
        self.set_next(prev, next);
        self.set_prev(next, prev);
        let free_head = self.free_head;
        let taken = self.node_mut(slot).and_then(|node| {
            node.prev = NO_SLOT;
            node.next = free_head;
            node.tree.take()
        });
        self.free_head = slot;
        self.len -= 1;
        tree.list_slot.store(NO_SLOT, Ordering::Relaxed);
        taken
    }

    /// Moves the head (least recently used) inode to the tail and returns a reference to it,
    /// with the list's length.
    pub(crate) fn rotate_head(&mut self) -> Option<(Arc<InodeTree>, usize)> {
        let slot = self.head;
        let node = self.node(slot)?;
        let tree = node.tree.as_ref().map(Arc::clone)?;
        if self.len > 1 {
            let next = node.next;
            self.head = next;
            self.set_prev(next, NO_SLOT);
            let tail = self.tail;
            self.set_next(tail, slot);
            if let Some(node) = self.node_mut(slot) {
                node.prev = tail;
                node.next = NO_SLOT;
            }
            self.tail = slot;
        }
        Some((tree, self.len))
    }

    /// Calls `visit` for every linked inode in slots `[first, first + count)`, in slot order.
    pub(crate) fn visit_slots(
        &self,
        first: usize,
        count: usize,
        mut visit: impl FnMut(&InodeTree),
    ) {
        let end = first.saturating_add(count).min(self.capacity());
        for slot in first..end {
            let chunk = self.chunks.get(slot / RECLAIM_CHUNK_SLOTS);
            if let Some(tree) = chunk.and_then(|c| c.get(slot % RECLAIM_CHUNK_SLOTS)?.tree.as_ref())
            {
                visit(tree);
            }
        }
    }

    /// Checks links both ways, the length, slot back-references and the free chain.
    /// O(capacity): for tests.
    pub(crate) fn check_invariants(&self) -> Result<(), ExtCacheError> {
        let broken = |what: String| Err(ExtCacheError::Invariant { what });
        let (mut slot, mut prev, mut seen) = (self.head, NO_SLOT, 0usize);
        while slot != NO_SLOT {
            let Some(node) = self.node(slot) else {
                return broken(format!("reclaim list links to slot {slot} past the slab"));
            };
            if node.prev != prev {
                return broken(format!("slot {slot}: prev {} (want {prev})", node.prev));
            }
            let Some(tree) = node.tree.as_ref() else {
                return broken(format!("linked slot {slot} holds no inode"));
            };
            if tree.list_slot.load(Ordering::Relaxed) != slot {
                return broken(format!("inode {} does not know its slot {slot}", tree.ino));
            }
            seen += 1;
            if seen > self.len {
                return broken(format!("reclaim list longer than its length {}", self.len));
            }
            (prev, slot) = (slot, node.next);
        }
        if prev != self.tail || seen != self.len {
            return broken(format!(
                "tail {} / length {} (walked {prev} / {seen})",
                self.tail, self.len
            ));
        }
        let mut free = 0usize;
        let mut slot = self.free_head;
        while let Some(node) = self.node(slot) {
            if node.tree.is_some() {
                return broken(format!("free slot {slot} still holds an inode"));
            }
            free += 1;
            if free > self.capacity() {
                return broken("free chain loops".to_string());
            }
            slot = node.next;
        }
        if free + self.len != self.capacity() {
            return broken(format!(
                "{free} free + {} linked != {} slots",
                self.len,
                self.capacity()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(ino: u64) -> Arc<InodeTree> {
        Arc::new(InodeTree::new_for_test(ino))
    }

    fn order(list: &ReclaimList) -> Vec<u64> {
        let mut out = Vec::new();
        let mut slot = list.head;
        while let Some(node) = list.node(slot) {
            out.extend(node.tree.as_ref().map(|t| t.ino));
            slot = node.next;
        }
        out
    }

    #[test]
    fn link_unlink_and_rotate_keep_the_list_whole() {
        // Push, remove from head/middle/tail and rotate, checking order and links each step.
        let mut list = ReclaimList::new();
        let trees: Vec<_> = (0..5).map(tree).collect();
        for t in &trees {
            assert!(list.push_back(t));
            assert!(list.push_back(t), "second link is a no-op");
            list.check_invariants().unwrap();
        }
        assert_eq!(order(&list), vec![0, 1, 2, 3, 4]);
        assert!(list.remove(&trees[2]).is_some());
        assert!(list.remove(&trees[2]).is_none());
        list.check_invariants().unwrap();
        let (head, len) = list.rotate_head().unwrap();
        assert_eq!((head.ino, len), (0, 4));
        assert_eq!(order(&list), vec![1, 3, 4, 0]);
        list.check_invariants().unwrap();
        assert!(list.remove(&trees[0]).is_some());
        assert!(list.remove(&trees[1]).is_some());
        list.check_invariants().unwrap();
        assert_eq!(order(&list), vec![3, 4]);
        assert!(list.push_back(&trees[2]));
        assert_eq!(order(&list), vec![3, 4, 2]);
        list.check_invariants().unwrap();
    }

    #[test]
    fn the_slab_grows_by_chunks_and_reuses_free_slots() {
        // More inodes than one chunk holds: a second chunk appears; freed slots are reused.
        let mut list = ReclaimList::new();
        let trees: Vec<_> = (0..(RECLAIM_CHUNK_SLOTS as u64 + 10)).map(tree).collect();
        for t in &trees {
            assert!(list.push_back(t));
        }
        list.check_invariants().unwrap();
        assert_eq!(list.capacity(), 2 * RECLAIM_CHUNK_SLOTS);
        for t in trees.iter().step_by(3) {
            assert!(list.remove(t).is_some());
        }
        list.check_invariants().unwrap();
        for t in trees.iter().step_by(3) {
            assert!(list.push_back(t));
        }
        list.check_invariants().unwrap();
        assert_eq!(list.capacity(), 2 * RECLAIM_CHUNK_SLOTS);
        let mut seen = 0;
        list.visit_slots(0, list.capacity(), |_| seen += 1);
        assert_eq!(seen, trees.len());
        let mut empty = ReclaimList::new();
        assert!(empty.rotate_head().is_none());
        empty.check_invariants().unwrap();
    }
}
