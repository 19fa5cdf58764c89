//! The cache's lock-free protocol: every operation on a buffer's state word and on an AG's
//! generation, with its ordering, and the decisions taken on what they return.
//!
//! Everything here is generic over the atomic (`cairn_atomic::AtomicWord`): the cache runs it
//! on std's `AtomicU64` (the default type parameter; the forwards inline to the bare atomic
//! instruction), and the loom models in `models.rs` run the same functions on loom's atomics,
//! which try every interleaving and every value the memory model lets a load return. So what
//! is model-checked is what runs; only the locks and queues around it are the model's own.
//!
//! The state word packs everything a lock-free reader or the reclaimer must decide on in one
//! atomic, so "take a hold" and "mark dead if unheld" are single read-modify-writes on the same
//! word and cannot interleave: either the hold lands first and reclaim's compare-exchange
//! fails, or reclaim lands first and the reader sees `DEAD` and lets go.

use std::sync::atomic::{AtomicU64, Ordering};

use cairn_atomic::AtomicWord;

/// Holds: callers with a reference from `get` (or write-back), bits 0..24.
pub(crate) const HOLD_ONE: u64 = 1;
pub(crate) const HOLD_MASK: u64 = (1 << 24) - 1;
/// Pins: log items whose changes are not checkpointed yet, bits 24..48.
pub(crate) const PIN_ONE: u64 = 1 << 24;
pub(crate) const PIN_MASK: u64 = ((1 << 24) - 1) << 24;
/// Has changes not yet written home.
pub(crate) const DIRTY: u64 = 1 << 48;
/// Freed metadata: never written home, never returned by a lookup.
pub(crate) const STALE: u64 = 1 << 49;
/// Removed from the index; a lookup that holds it must let go and look again.
pub(crate) const DEAD: u64 = 1 << 50;
/// Has an entry in the LRU queue.
pub(crate) const ON_LRU: u64 = 1 << 51;
/// Has an entry in the delayed-write queue.
pub(crate) const DELWRI_Q: u64 = 1 << 52;

/// What reclaim may not take: anything held, pinned, dirty or already dead.
pub(crate) const UNRECLAIMABLE: u64 = HOLD_MASK | PIN_MASK | DIRTY | DEAD;

/// Hold count of a state word.
pub(crate) fn holds(state: u64) -> u64 {
    state & HOLD_MASK
}

/// Pin count of a state word.
pub(crate) fn pins(state: u64) -> u32 {
    ((state & PIN_MASK) >> 24) as u32
}

/// What reclaim does with a buffer popped from the LRU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Freed,
    /// Keep it: back of the queue.
    Rotate,
    /// Off the queue: dead, or held (its last release re-queues it).
    Leave,
}

/// What write-back may do with a locked, queued buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteCheck {
    /// Clean, stale or dead: nothing to write, off the queue.
    Nothing,
    /// Its changes are not checkpointed: not yet, stays queued.
    Pinned,
    Write,
}

/// A buffer's state word: holds, pins and flags (see the constants).
pub(crate) struct StateWord<W = AtomicU64> {
    word: W,
}

impl<W: AtomicWord> StateWord<W> {
    /// The word of a new buffer: one hold (its inserter's), no flag.
    pub(crate) fn held_once() -> Self {
        Self {
            word: W::new(HOLD_ONE),
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// A word in any state, for the models.
    #[cfg(test)]
    pub(crate) fn with_state(state: u64) -> Self {
        Self {
            word: W::new(state),
        }
    }

    /// The word for a debug print: no ordering needed.
    pub(crate) fn peek(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// Takes a hold; returns the state before.
    #[inline]
    pub(crate) fn hold(&self) -> u64 {
        let prev = self.word.fetch_add(HOLD_ONE, Ordering::Acquire);
        debug_assert!(prev & HOLD_MASK < HOLD_MASK, "hold count overflow");
        prev
    }

    /// Takes a hold and says whether the buffer was live (neither stale nor dead) when it
    /// landed. The hold is taken either way: a caller told `false` releases it. Being one
    /// read-modify-write with reclaim's exchange to `DEAD`, a `true` hold keeps the buffer
    /// from reclaim until released.
    #[inline]
    pub(crate) fn hold_live(&self) -> bool {
        self.hold() & (STALE | DEAD) == 0
    }

    /// Drops one hold; returns the state before.
    #[inline]
    pub(crate) fn unhold(&self) -> u64 {
        let prev = self.word.fetch_sub(HOLD_ONE, Ordering::Release);
        debug_assert!(prev & HOLD_MASK > 0, "hold count underflow");
        prev
    }

    /// Drops one hold. True when the caller must push the buffer on the LRU queue: this was
    /// the last hold of a live buffer not queued, and this call claimed `ON_LRU` for it.
    /// Reclaim clears `ON_LRU` of a held buffer only with an exchange that fails if the hold
    /// count moved (`judge`), so the buffer is queued exactly once.
    #[inline]
    pub(crate) fn release(&self) -> bool {
        let prev = self.unhold();
        holds(prev) == 1 && prev & (ON_LRU | DEAD) == 0 && self.claim(ON_LRU)
    }

    /// Sets `flag`; true if this call set it (it was clear).
    pub(crate) fn claim(&self, flag: u64) -> bool {
        self.set_flags(flag) & flag == 0
    }

    /// Sets `flags`; returns the state before.
    pub(crate) fn set_flags(&self, flags: u64) -> u64 {
        self.word.fetch_or(flags, Ordering::AcqRel)
    }

    /// Clears `flags`; returns the state before.
    pub(crate) fn clear_flags(&self, flags: u64) -> u64 {
        self.word.fetch_and(!flags, Ordering::AcqRel)
    }

    /// Neither stale nor dead.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.load() & (STALE | DEAD) == 0
    }

    /// Marks a changed buffer dirty (the caller holds its lock) unless it is dirty already or
    /// stale (a stale buffer's changes are dropped: it is never written home).
    pub(crate) fn mark_dirty(&self) {
        if self.load() & (DIRTY | STALE) == 0 {
            self.set_flags(DIRTY);
        }
    }

    /// Marks the buffer stale and drops its dirtiness (the caller holds its lock and the AG's
    /// write lock, and bumps the AG's generation after).
    pub(crate) fn mark_stale(&self) {
        self.set_flags(STALE);
        self.clear_flags(DIRTY);
    }

    /// One more pin (the caller holds the buffer's lock).
    pub(crate) fn pin(&self) {
        self.word.fetch_add(PIN_ONE, Ordering::AcqRel);
    }

    /// Drops one pin, without the buffer's lock (checkpoint completion); false if there was
    /// none. The release orders what the checkpoint wrote before write-back's check.
    pub(crate) fn unpin(&self) -> bool {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & PIN_MASK != 0).then_some(s - PIN_ONE)
            })
            .is_ok()
    }

    /// Write-back's check of a queued buffer it holds locked. Pins change without the lock
    /// (unpin), so a pin seen here may go at once, but none can appear: pinning needs the lock.
    pub(crate) fn write_check(&self) -> WriteCheck {
        let state = self.load();
        if state & (STALE | DEAD) != 0 || state & DIRTY == 0 {
            WriteCheck::Nothing
        } else if pins(state) > 0 {
            WriteCheck::Pinned
        } else {
            WriteCheck::Write
        }
    }

    /// Reclaim's judgement of a buffer popped from the LRU. `second_chance` spends one of the
    /// buffer's reuse counts (true if it had one); `try_free` takes the AG's write lock and
    /// tries `try_kill` (true if the buffer was freed).
    pub(crate) fn judge(
        &self,
        second_chance: impl FnOnce() -> bool,
        try_free: impl FnOnce() -> bool,
    ) -> Verdict {
        loop {
            let state = self.load();
            if state & DEAD != 0 {
                return Verdict::Leave;
            }
            if holds(state) > 0 {
                // Clearing ON_LRU must not race with the last release, which re-queues only if
                // ON_LRU is clear: the exchange fails if the hold count moved, and we look again.
                let cleared = state & !ON_LRU;
                let exchange =
                    self.word
                        .compare_exchange(state, cleared, Ordering::AcqRel, Ordering::Acquire);
                if exchange.is_ok() {
                    return Verdict::Leave;
                }
                continue;
            }
            if state & (PIN_MASK | DIRTY) != 0 {
                return Verdict::Rotate;
            }
            if state & STALE == 0 && second_chance() {
                return Verdict::Rotate;
            }
            return if try_free() {
                Verdict::Freed
            } else {
                Verdict::Rotate
            };
        }
    }

    /// Marks the buffer dead if nothing reclaim must respect (hold, pin, dirt) is there; true
    /// if it did. A reader's hold is a change to the same word, so this exchange and that hold
    /// cannot both succeed.
    pub(crate) fn try_kill(&self) -> bool {
        let state = self.load();
        if state & UNRECLAIMABLE != 0 {
            return false;
        }
        self.word
            .compare_exchange(state, state | DEAD, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl<W: AtomicWord> std::fmt::Debug for StateWord<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateWord({:#x})", self.peek())
    }
}

/// An AG's generation: bumped, under the AG's write lock, after every removal from the index
/// and every stale marking; the threads' lookaside tables compare it with their last sweep's.
pub(crate) struct Generation<W = AtomicU64> {
    word: W,
}

impl<W: AtomicWord> Generation<W> {
    pub(crate) fn new() -> Self {
        Self { word: W::new(0) }
    }

    /// Called after a buffer's `DEAD` or `STALE` flag was set: the release orders the flag
    /// before the new generation for the threads' sweeps.
    pub(crate) fn bump(&self) {
        self.word.fetch_add(1, Ordering::Release);
    }

    /// The current generation; the acquire makes every flag set before it visible, so a
    /// sweep at the generation read sees every buffer that died or went stale before it.
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }
}

impl<W: AtomicWord> std::fmt::Debug for Generation<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Generation")
            .field(&self.word.load(Ordering::Relaxed))
            .finish()
    }
}
