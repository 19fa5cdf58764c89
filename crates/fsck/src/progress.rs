//! A progress line on stderr while a large filesystem is checked: the phase, the AGs done out
//! of all, and the inodes checked. Drawn only when stderr is a terminal (and not with `-q`);
//! otherwise every call does nothing, so scripts and logs see only the report.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const TEMPLATE: &str = "{prefix:>12} [{bar:30}] {pos}/{len} AGs, {msg} ({elapsed})";
/// Redraws per second at most: the check must not wait on the terminal.
const REFRESH_HZ: u8 = 8;

/// The progress line of one fsck run (cheap to clone: clones share the line).
#[derive(Debug, Clone, Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// No progress line.
    pub fn hidden() -> Self {
        Self::default()
    }

    /// A progress line on stderr if stderr is a terminal, else none.
    pub fn on_terminal() -> Self {
        if !std::io::stderr().is_terminal() {
            return Self::hidden();
        }
        Self::with_target(ProgressDrawTarget::stderr_with_hz(REFRESH_HZ))
    }

    /// A progress line drawn to `target`.
    pub fn with_target(target: ProgressDrawTarget) -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), target);
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(500));
        Self { bar: Some(bar) }
    }

    /// A new phase over `ags` allocation groups, none done yet.
    pub(crate) fn phase(&self, name: &'static str, ags: u32) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(name);
            bar.set_length(u64::from(ags));
            bar.set_position(0);
        }
    }

    /// A new phase that is not counted in AGs (the AG count stays as it was).
    pub(crate) fn label(&self, name: &'static str) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(name);
        }
    }

    /// `done` AGs of the phase finished; `inodes` checked so far.
    pub(crate) fn ags_done(&self, done: u32, inodes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(u64::from(done));
            bar.set_message(format!("{inodes} inodes"));
        }
    }

    /// Removes the line (before the report is printed).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// The (position, length) shown, for tests.
    pub fn shown(&self) -> Option<(u64, u64)> {
        let bar = self.bar.as_ref()?;
        Some((bar.position(), bar.length().unwrap_or(0)))
    }

    /// The phase name shown, for tests.
    pub fn phase_name(&self) -> Option<String> {
        Some(self.bar.as_ref()?.prefix())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cairn_blockdev::MemDevice;
    use cairn_mkfs::{FormatOptions, Request};

    use super::*;
    use crate::check::Checker;

    // A check advances the line through every AG and ends on its last phase.
    #[test]
    fn a_check_counts_every_ag() {
        let bytes = 64 << 20;
        let device = MemDevice::new(bytes, 4096);
        let plan = cairn_mkfs::plan(bytes, 4096, &Request::default()).unwrap();
        let options = FormatOptions {
            uuid: Some([3; 16]),
            discard: false,
            now_secs: 0,
        };
        let superblock = cairn_mkfs::format(&device, &plan, &options)
            .unwrap()
            .superblock;
        let progress = Progress::with_target(ProgressDrawTarget::hidden());
        let mut checker = Checker::new(&device, superblock.clone());
        checker.progress = progress.clone();
        let report = checker.run();
        assert!(report.is_clean(), "{report:?}");
        let ags = u64::from(superblock.geometry.ag_count);
        assert_eq!(progress.shown(), Some((ags, ags)));
        assert_eq!(progress.phase_name().as_deref(), Some("accounting"));
        progress.finish();
        assert_eq!(Progress::hidden().shown(), None);
    }
}
