//! Negotiating the session with the kernel: the capabilities that make FUSE fast.

use fuser::{InitFlags, KernelConfig};

use super::CairnFs;

/// Background requests (readahead, async direct I/O, writeback) the kernel may queue.
const MAX_BACKGROUND: u16 = 64;
/// Queue depth at which the kernel treats the connection as congested (3/4 of the above).
const CONGESTION_THRESHOLD: u16 = 48;

impl CairnFs {
    /// The capabilities asked of the kernel; ones it lacks are skipped and logged.
    fn wanted_capabilities(&self) -> InitFlags {
        let mut wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_CACHE_SYMLINKS
            // The daemon clears the set-ID bits on write, truncate and chown (the kernel
            // then skips its per-write security.capability lookup: SB_NOSEC).
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // O_DIRECT opens (FOPEN_DIRECT_IO) may be mapped too; the kernel writes back
            // and drops cached pages around direct I/O to keep the two coherent.
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            // File handles (NFS export, open_by_handle_at) outlive the kernel's inode: it
            // then looks up "." by node id, and ".." to reconnect directories.
            | InitFlags::FUSE_EXPORT_SUPPORT
            // POSIX ACLs: the kernel enforces them from system.posix_acl_access (which it
            // caches), and leaves the umask to us (DONT_MASK), since a default ACL on the
            // parent replaces it.
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK;
        // The writeback cache lets the kernel own size and mtime and hand us large writes;
        // right for a local filesystem with one daemon. Pointless on a read-only mount.
        if self.settings.writeback_cache && !self.read_only {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        wanted
    }

    /// Applies the session settings to `config` during the FUSE handshake.
    pub(super) fn negotiate(&self, config: &mut KernelConfig) {
        let offered = config.capabilities();
        let wanted = self.wanted_capabilities();
        let missing = wanted & !offered;
        if !missing.is_empty() {
            tracing::info!(
                ?missing,
                "kernel lacks some FUSE capabilities; running without"
            );
        }
        if let Err(unsupported) = config.add_capabilities(wanted & offered) {
            tracing::warn!(?unsupported, "kernel refused FUSE capabilities");
        }
        let max_write = self.settings.max_write_bytes;
        if let Err(nearest) = config.set_max_write(max_write) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(max_write) {
            let _ = config.set_max_readahead(nearest);
        }
        if let Some(ring) = &self.ring {
            ring.negotiate(config);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(CONGESTION_THRESHOLD);
        tracing::info!(
            capabilities = ?(wanted & offered),
            max_write,
            "FUSE session negotiated"
        );
    }
}
