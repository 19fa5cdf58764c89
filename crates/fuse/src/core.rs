//! The filesystem core the daemon serves, behind a gate: every request reads it through a
//! shared guard, and whoever must own it (the `FUSE_DESTROY` request, which unmounts it
//! before the kernel's `umount` returns, or the daemon once the session ended) takes it out
//! under the exclusive lock, which waits for the requests in flight.
//!
//! Readers use `read_recursive`, so a request that reaches the core twice never waits
//! behind a writer that is waiting for that same request.

use std::sync::Arc;

use cairn_fs::{Filesystem, FsError};
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

    /// How the core was unmounted by `unmount`.
    pub fn unmounted(&self) -> Unmounted {
        self.unmounted.lock().clone()
    }
}
