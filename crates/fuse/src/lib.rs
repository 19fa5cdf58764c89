//! cairn-fuse: the `cairn` daemon. It mounts a cairn filesystem through the kernel's FUSE
//! interface with `fuser` and serves every request from `cairn_fs::Filesystem`; it also
//! holds `cairn stats` (counters read back through a reserved xattr) and the man page
//! generator for every cairn binary. The design is in `docs/fuse.md`.
//!
//! Owns: the translation between FUSE requests and the filesystem API (`adapter`), the one
//! place where `FsError` becomes an errno (`errno`), mount option parsing (`options`), the
//! per-request-type counters (`stats`), daemonizing, signals and clean unmount (`daemon`),
//! logging setup (`logging`), and the command line (`cli`, `man`).
//! Invariants:
//! - every request gets exactly one reply, sent after the filesystem call returned and
//!   with no filesystem lock held (the filesystem API holds none across its return);
//! - a lookup reference taken in the filesystem (lookup, create, mkdir, symlink, link,
//!   mknod, readdirplus entries) is either handed to the kernel in a reply or dropped
//!   again with `forget`, so the kernel's counts and the filesystem's agree;
//! - no request waits for another request's reply (safe with one worker thread or many);
//! - the filesystem is unmounted (everything written back, clean log) whenever the FUSE
//!   session ends, whether by `umount`, SIGTERM or SIGINT.

pub mod adapter;
pub mod background;
pub mod bdi;
pub mod blkmount;
pub mod cli;
pub mod convert;
pub mod core;
pub mod daemon;
pub mod errno;
pub mod extsize;
pub mod fileattr;
pub mod logging;
pub mod man;
pub mod options;
pub mod stats;
pub mod stats_export;
pub mod uring;
pub mod watchdog;

pub use adapter::CairnFs;
pub use errno::ToErrno;
pub use options::{MountConfig, OptionError};
