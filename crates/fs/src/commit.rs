//! The commit window (`MountOptions::commit_interval_ms`, the daemon's `-o commit=`):
//! whatever the filesystem received longer ago than the window is durable without an
//! `fsync`, data and metadata, as ext4's `commit=` promises for its journal. A FUSE daemon
//! never sees `sync(2)` (the kernel sends `FUSE_SYNCFS` to virtiofs only), so this, and
//! `cairn sync`, are what give `sync` a meaning on a cairn mount.
//!
//! Each background pass (the daemon runs one at least every `background_interval`, a
//! quarter of the window, capped at 1 s) writes back cached data that has been dirty for
//! half the window, and then forces the log if it wrote such data or if the oldest commit
//! not yet in a checkpoint has waited half the window. So a change received at time t is written
//! and forced by a pass that starts before t + window/2 + interval, and durable when that
//! pass's I/O ends: about t + 3.5 s plus the I/O with the default 5 s window.
//!
//! Owns: nothing but the policy (the journal keeps when its oldest unpushed commit arrived;
//! write-behind keeps when each inode's data became dirty).
//! Invariants:
//! - an idle filesystem does no I/O: no cached pages and an empty CIL mean no writeback and
//!   no force;
//! - before a force, the files a truncate emptied are written back (`write_back_emptied`),
//!   so the checkpoint that makes the truncate durable holds their new data too.

use std::time::{Duration, Instant};

use crate::fs::Filesystem;

/// The background pass interval never exceeds this, whatever the window.
const PASS_INTERVAL_MAX: Duration = Duration::from_secs(1);
/// Nor goes below this (a window of a few milliseconds is a test's).
const PASS_INTERVAL_MIN: Duration = Duration::from_millis(10);

impl Filesystem {
    /// The commit window.
    pub fn commit_window(&self) -> Duration {
        Duration::from_millis(self.options.commit_interval_ms)
    }

    /// How often the background thread must run `background_pass` for the commit window
    /// to hold: a quarter of the window, between 10 ms and 1 s.
    pub fn background_interval(&self) -> Duration {
        (self.commit_window() / 4).clamp(PASS_INTERVAL_MIN, PASS_INTERVAL_MAX)
    }

    /// The commit window's part of a background pass, as of `now` (see the module comment).
    pub(crate) fn commit_window_pass(&self, now: Instant) {
        if self.journal.shutdown_reason().is_some() {
            return;
        }
        let half = self.commit_window() / 2;
        // Writeback for the cache's fill alone forces nothing: its commits are forced when
        // they have waited half the window, as any other.
        let wrote_expired = self.write_back_background(now, half);
        let Some(oldest) = self.journal.oldest_unpushed_commit() else {
            return;
        };
        if !wrote_expired && now.saturating_duration_since(oldest) < half {
            return;
        }
        self.write_back_emptied();
        if let Err(error) = self.journal.force_all() {
            tracing::error!(%error, "the commit window's log force failed");
        }
    }
}
