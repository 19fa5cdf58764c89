//! Work the daemon runs on a thread of its own, between requests: write-behind's
//! background writeback and inode reclaim. The thread waits on a `BackgroundSignal` (woken
//! early when cached data passes a quarter of the cap or a reclaim pass is due), then runs
//! `Filesystem::background_pass`.
//!
//! Owns: the signal and whether a thread is attached to it.
//! Invariants:
//! - while a thread is attached, a request that finds a reclaim pass due hands it to the
//!   thread rather than running it: a pass may force the log and push the AIL, and it
//!   looks at every candidate inode, which must not stall the request that happened to
//!   cross the interval (a `CREATE` waited 95 ms for one);
//! - a pass handed over is run by the thread's next pass (or, after the thread detached,
//!   claimed again by a later request), so reclaim is never lost, only moved.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_lockrank::{Mutex, Rank};
use parking_lot::Condvar;

use crate::fs::Filesystem;

/// What the daemon's background thread waits on between passes.
#[derive(Debug)]
pub struct BackgroundSignal {
    pending: Mutex<bool>,
    cond: Condvar,
    /// A reclaim pass was claimed by a request and handed to the thread.
    reclaim: AtomicBool,
    /// A thread runs `background_pass` after each wait.
    attached: AtomicBool,
}

impl BackgroundSignal {
    pub(crate) fn new() -> Self {
        Self {
            pending: Mutex::new(Rank::Leaf, false),
            cond: Condvar::new(),
            reclaim: AtomicBool::new(false),
            attached: AtomicBool::new(false),
        }
    }

    /// Waits until a pass is wanted early or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let mut pending = self.pending.lock();
        if !*pending {
            pending.wait_for(&self.cond, timeout);
        }
        *pending = false;
    }

    /// Ends the current wait at once (a pass is wanted, or the waiter should stop).
    pub fn wake(&self) {
        *self.pending.lock() = true;
        self.cond.notify_one();
    }

    /// Hands a claimed reclaim pass to the attached thread; false (the caller runs the pass
    /// itself) when no thread is attached.
    fn hand_over_reclaim(&self) -> bool {
        if !self.attached.load(Ordering::Acquire) {
            return false;
        }
        self.reclaim.store(true, Ordering::Release);
        self.wake();
        true
    }
}

impl Filesystem {
    /// Attaches the caller as the background thread: from now on it must call
    /// `background_pass` after each wait on the returned signal, until `detach_background`.
    pub fn attach_background(&self) -> Arc<BackgroundSignal> {
        self.background.attached.store(true, Ordering::Release);
        Arc::clone(&self.background)
    }

    /// The background thread stops: requests run reclaim passes themselves again, and a pass
    /// handed over but not run yet is run now.
    pub fn detach_background(&self) {
        self.background.attached.store(false, Ordering::Release);
        self.reclaim_handed_over();
    }

    /// One pass of the background thread, to run at least every `background_interval`:
    /// writes back the oldest cached data while the cache is a quarter full, and what the
    /// commit window says is due, forcing the log when that window says so
    /// (`commit_window_pass`); then runs the reclaim pass a request handed over.
    pub fn background_pass(&self) {
        self.background_pass_at(Instant::now());
    }

    /// `background_pass` as if it ran at `now`: a later instant plays a wait (the crash
    /// explorer's `Op::Wait`, tests of the commit window), so everything received before the
    /// call is as old as the window says is due.
    pub fn background_pass_at(&self, now: Instant) {
        self.commit_window_pass(now);
        self.reclaim_handed_over();
    }

    /// Runs the reclaim pass a request handed over, if there is one.
    fn reclaim_handed_over(&self) {
        if self.background.reclaim.swap(false, Ordering::AcqRel) {
            self.reclaim_inodes();
        }
    }

    /// Runs the inode reclaim pass a request claimed (`InodeCache::reclaim_due`): on the
    /// background thread if one is attached, else here.
    pub(crate) fn reclaim_claimed(&self) {
        if !self.background.hand_over_reclaim() {
            self.reclaim_inodes();
        }
    }
}
