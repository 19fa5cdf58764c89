//! The filesystem core the daemon serves, behind a gate: every request reads it through a
//! shared guard, and whoever must own it (the `FUSE_DESTROY` request, which unmounts it
//! before the kernel's `umount` returns, or the daemon once the session ended) takes it out
//! under the exclusive lock, which waits for the requests in flight.
//!
//! Readers use `read_recursive`, so a request that reaches the core twice never waits
//! behind a writer that is waiting for that same request.

use std::sync::Arc;

use cairn_fs::{Filesystem, FsError, GrowReport};
use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};

/// The core, read by a request for as long as the guard lives.
pub type CoreRef<'a> = MappedRwLockReadGuard<'a, Filesystem>;

/// How the core was unmounted, if it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmounted {
    /// Still mounted (or taken out by the daemon itself).
    No,
    /// Unmounted cleanly while answering `FUSE_DESTROY`.
    Clean,
    /// Unmounting failed with this message.
    Failed(String),
}

/// The mounted core shared by the request handlers and the daemon.
#[derive(Debug)]
pub struct CoreSlot {
    core: RwLock<Option<Filesystem>>,
    unmounted: Mutex<Unmounted>,
}

impl CoreSlot {
    pub fn new(core: Filesystem) -> Arc<Self> {
        Arc::new(Self {
            core: RwLock::new(Some(core)),
            unmounted: Mutex::new(Unmounted::No),
        })
    }

    /// The core, or `ShutDown` once it has been unmounted.
    pub fn get(&self) -> Result<CoreRef<'_>, FsError> {
        RwLockReadGuard::try_map(self.core.read_recursive(), Option::as_ref)
            .map_err(|_| FsError::ShutDown)
    }

    /// Takes the core out, once every request in flight has left it.
    pub fn take(&self) -> Option<Filesystem> {
        self.core.write().take()
    }

    /// Unmounts the core (everything written back, a clean log, the device closed) and
    /// records how that went; later requests get `ShutDown`. What `FUSE_DESTROY` does.
    pub fn unmount(&self) {
        let Some(core) = self.take() else {
            return;
        };
        let outcome = match core.unmount() {
            Ok(()) => {
                tracing::info!("filesystem unmounted cleanly");
                Unmounted::Clean
            }
            Err(error) => {
                tracing::error!(%error, "unmounting the filesystem failed");
                Unmounted::Failed(error.to_string())
            }
        };
        *self.unmounted.lock() = outcome;
    }

    /// Grows the mounted filesystem to `size` bytes (the device's size if `None`; an image
    /// file is extended first): requests wait while the core is taken out, grown (which
    /// unmounts it cleanly) and mounted again, with every inode reference the kernel holds
    /// carried over. Refused (`Busy`, nothing changed) while a deleted file is still open:
    /// it sits on the unlinked list, which a mount empties.
    pub fn grow(&self, size: Option<u64>) -> Result<GrowReport, GrowError> {
        let mut slot = self.core.write();
        let Some(fs) = slot.take() else {
            return Err(GrowError::Failed(FsError::ShutDown.to_string()));
        };
        let held = fs.held_inodes();
        let check = || -> Result<GrowReport, GrowError> {
            if held.iter().any(|one| !one.linked) {
                return Err(GrowError::Busy);
            }
            let grown = fs
                .device()
                .grow_to(size)
                .map_err(|e| GrowError::Failed(e.to_string()));
            let block_size = u64::from(fs.statfs().map_err(GrowError::from)?.block_size);
            grown?;
            let blocks = size.map_or(u64::MAX, |size| size / block_size);
            fs.plan_grow(blocks).map_err(GrowError::from)
        };
        let report = match check() {
            Ok(report) => report,
            Err(error) => {
                *slot = Some(fs);
                return Err(error);
            }
        };
        let (device, options) = (fs.device(), fs.options().clone());
        let grown = fs.grow(report.new_blocks).map_err(GrowError::from);
        match Filesystem::mount(device, options).and_then(|new| {
            new.hold_inodes(&held)?;
            Ok(new)
        }) {
            Ok(new) => *slot = Some(new),
            Err(error) => {
                tracing::error!(%error, "mounting again after the grow failed");
                *self.unmounted.lock() = Unmounted::Failed(error.to_string());
            }
        }
        grown
    }

    /// How the core was unmounted by `unmount`.
    pub fn unmounted(&self) -> Unmounted {
        self.unmounted.lock().clone()
    }
}

/// Why an online grow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    #[error("a deleted file is still open; close it, or unmount and grow offline")]
    Busy,
    #[error(transparent)]
    Refused(FsError),
    #[error("{0}")]
    Failed(String),
}

impl From<FsError> for GrowError {
    fn from(error: FsError) -> Self {
        match error {
            FsError::InvalidArgument(_) | FsError::ReadOnly => GrowError::Refused(error),
            other => GrowError::Failed(other.to_string()),
        }
    }
}
