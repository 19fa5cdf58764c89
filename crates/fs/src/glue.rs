//! Glue between the journal and the trees and allocator: a transaction as `Buffers`, the
//! journal as the allocator's `LogSequence`, and the `TreeContext` of the per-AG inode trees.

use cairn_alloc::{Allocator, LogSequence, Request};
use cairn_btree::{Buffers, TreeContext, TreeError};
use cairn_bufcache::{BufGuard, BufKey, ReadSpec};
use cairn_format::FsBlock;
use cairn_journal::{Journal, Transaction};

/// A transaction seen as the trees' and allocator's buffer context.
#[derive(Debug)]
pub(crate) struct Tx<'j> {
    pub tx: Transaction<'j>,
    /// Blocks unmapped in this transaction under a free intent, to be freed once it commits
    /// (`dir::finish_deferred_frees`): freeing them in it could lock a lower AG's header
    /// after a higher one (docs/alloc.md, lock order).
    pub deferred_frees: Vec<(cairn_journal::IntentId, Vec<cairn_format::Extent>)>,
}

impl Tx<'_> {
    /// Names `freed` (unmapped blocks) in a free intent of this transaction and leaves them
    /// to be freed after it commits (`Filesystem::commit`; a crash before that: mount frees
    /// them). For frees this transaction may not make itself: a lower AG's AGF than one it
    /// holds (AG locks ascend).
    pub(crate) fn defer_free(&mut self, freed: Vec<cairn_format::Extent>) {
        if freed.is_empty() {
            return;
        }
        let intent = self.tx.log_free_intent(&crate::bmap::free_extents(&freed));
        self.deferred_frees.push((intent, freed));
    }
}

fn journal_error(block: FsBlock, error: cairn_journal::JournalError) -> TreeError {
    match error {
        cairn_journal::JournalError::Buffer(source) => TreeError::Buffer {
            block: block.0,
            source,
        },
        other => TreeError::NoSpace {
            why: format!("journal refused block {}: {other}", block.0),
        },
    }
}

impl<'j> Buffers<'j> for Tx<'j> {
    #[track_caller]
    fn buffer(
        &mut self,
        block: FsBlock,
        spec: &ReadSpec,
        new: bool,
    ) -> Result<&mut BufGuard<'j>, TreeError> {
        let key = BufKey::single(block.0);
        let result = if new {
            self.tx.get_new_buf(key, spec)
        } else {
            self.tx.get_buf(key, spec)
        };
        result.map_err(|error| journal_error(block, error))
    }

    fn invalidate(&mut self, block: FsBlock, spec: &ReadSpec) -> Result<(), TreeError> {
        let key = BufKey::single(block.0);
        if self.tx.buf_mut(key).is_none() {
            self.tx
                .get_new_buf(key, spec)
                .map_err(|error| journal_error(block, error))?;
        }
        self.tx
            .invalidate_buf(key)
            .map_err(|error| journal_error(block, error))
    }

    fn holds(&mut self, block: FsBlock) -> bool {
        self.tx.buf_mut(BufKey::single(block.0)).is_some()
    }

    fn joined_mark(&mut self) -> usize {
        self.tx.joined_count()
    }

    fn release_unchanged_since(&mut self, mark: usize) -> bool {
        self.tx.release_unchanged_since(mark)
    }
}

/// `Buffers` for a tree context whose `tx` field is the transaction: every call goes to it.
macro_rules! buffers_through_tx {
    ($context:ident) => {
        impl<'j> cairn_btree::Buffers<'j> for $context<'_, 'j> {
            fn buffer(
                &mut self,
                block: cairn_format::FsBlock,
                spec: &cairn_bufcache::ReadSpec,
                new: bool,
            ) -> Result<&mut cairn_bufcache::BufGuard<'j>, cairn_btree::TreeError> {
                self.tx.buffer(block, spec, new)
            }

            fn invalidate(
                &mut self,
                block: cairn_format::FsBlock,
                spec: &cairn_bufcache::ReadSpec,
            ) -> Result<(), cairn_btree::TreeError> {
                self.tx.invalidate(block, spec)
            }

            fn holds(&mut self, block: cairn_format::FsBlock) -> bool {
                self.tx.holds(block)
            }

            fn joined_mark(&mut self) -> usize {
                self.tx.joined_mark()
            }

            fn release_unchanged_since(&mut self, mark: usize) -> bool {
                self.tx.release_unchanged_since(mark)
            }
        }
    };
}
pub(crate) use buffers_through_tx;

/// The journal as the allocator sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalLog<'a>(pub &'a Journal);

impl LogSequence for JournalLog<'_> {
    fn durable_sequence(&self) -> u64 {
        self.0.durable_sequence().0
    }

    fn force(&self, sequence: u64) -> Result<(), String> {
        // Busy extents carry `free_sequence`, one past the context their free joined, which
        // may still be the current one: a force of a sequence that has not begun would wait
        // for a checkpoint nobody pushes. Push the current context first; the sequence asked
        // for is then the new current one (or older), and forcing it completes.
        let current = self.0.current_sequence().0;
        if sequence > current {
            self.0
                .force(cairn_journal::CommitSequence(current))
                .map_err(|error| error.to_string())?;
        }
        let sequence = sequence.min(self.0.current_sequence().0);
        self.0
            .force(cairn_journal::CommitSequence(sequence))
            .map_err(|error| error.to_string())
    }
}

/// The sequence a commit starting now can land in at the latest for busy-extent purposes:
/// a commit joins the current context or a later one, so one past the current context is a
/// bound that holds unless two pushes race the commit (the busy list is then cleared one
/// checkpoint early, which only matters for data reuse; documented in docs/fs.md).
pub(crate) fn free_sequence(journal: &Journal) -> u64 {
    journal.current_sequence().0 + 1
}

/// Tree blocks of one AG's inode trees: taken from and given back to the allocator, always
/// inside that AG (the trees' pointers are AG-relative).
pub(crate) struct AgTreeCtx<'a, 'j> {
    pub tx: &'a mut Tx<'j>,
    pub alloc: &'a Allocator,
    pub journal: &'a Journal,
    pub ag: u32,
}

impl std::fmt::Debug for AgTreeCtx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgTreeCtx").field("ag", &self.ag).finish()
    }
}

buffers_through_tx!(AgTreeCtx);

impl<'j> TreeContext<'j> for AgTreeCtx<'_, 'j> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let geometry = self.alloc.geometry();
        let target = FsBlock(geometry.ag_start(self.ag));
        // Inode trees may use the AG's reserve: an inode free must not fail for want of space.
        // In this AG only: the trees' pointers are AG-relative, and no other AG's header
        // should be locked for nothing.
        let mut request = Request::near(target, 1, 1)
            .with_reserve()
            .in_target_ag_only();
        request.lowest_ag = cairn_format::AgNumber(self.ag);
        let log = JournalLog(self.journal);
        let found = self
            .alloc
            .allocate(self.tx, &log, &request)
            .map_err(|error| TreeError::NoSpace {
                why: error.to_string(),
            })?;
        match found {
            Some(allocation) if allocation.ag.0 == self.ag => Ok(allocation.fs_start),
            _ => Err(TreeError::NoSpace {
                why: "no free block in the inode tree's AG".into(),
            }),
        }
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        let sequence = free_sequence(self.journal);
        self.alloc
            .free(self.tx, &JournalLog(self.journal), block, 1, sequence)
            .map_err(|error| TreeError::NoSpace {
                why: error.to_string(),
            })
    }
}
