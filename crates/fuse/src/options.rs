//! `-o` mount options: the filesystem's own, the FUSE ones, and the generic ones that
//! `mount(8)` and `mount.fuse3` pass along.

use std::path::PathBuf;
use std::time::Duration;

use cairn_fs::{AtimeMode, LogMode, MountOptions};
use cairn_mkfs::size::parse_size;

/// Default worker threads: one per core, at most this many.
pub const THREADS_DEFAULT_MAX: usize = 8;
/// Largest worker thread count accepted.
pub const THREADS_MAX: usize = 64;
/// Default longest spin of a reading worker before it sleeps (`spin_us=`): a client's next
/// request comes within tens of microseconds, and waking a sleeping thread on an idle
/// virtual CPU costs about as much (untar of 24,403 entries: 10.5-10.8 s without, 6.9 s
/// with). The spin adapts below this, so an idle mount does not spin (see fuser's
/// `ReaderGate`).
pub const REQUEST_SPIN_DEFAULT: Duration = Duration::from_micros(50);
/// Largest `spin_us` accepted.
pub const REQUEST_SPIN_MAX_US: u64 = 1000;
/// Default largest write the kernel sends (it caps this at its own page limit, 1 MiB
/// on current kernels by default).
pub const MAX_WRITE_DEFAULT_BYTES: u32 = 1 << 20;
/// Largest `max_write` accepted (fuser's request buffer limit).
pub const MAX_WRITE_MAX_BYTES: u32 = 16 << 20;
/// Default readahead window of the mount (the kernel gives FUSE mounts 128 KiB; XFS on a
/// loop device reads ahead 2.5 MiB). See `bdi.rs`.
pub const READAHEAD_DEFAULT_BYTES: u64 = 4 << 20;
/// Largest readahead window accepted.
pub const READAHEAD_MAX_BYTES: u64 = 256 << 20;
/// Default share of the kernel's dirty page limit the mount may hold, in percent (the
/// kernel gives FUSE mounts 1%). See `bdi.rs`.
pub const DIRTY_RATIO_DEFAULT: u8 = 10;
/// Default attribute and entry timeout. The daemon is the only writer of the device, and
/// the kernel invalidates what its own requests change, so a long timeout is safe.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Longest commit window accepted (`commit=`): an hour.
pub const COMMIT_MAX: Duration = Duration::from_secs(3600);
/// Default write-behind cache (`data_cache=`): 256 MiB, at most an eighth of the memory.
pub const DATA_CACHE_DEFAULT_BYTES: u64 = 256 << 20;

/// A `-o` option that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionError {
    #[error("unknown mount option '{0}'")]
    Unknown(String),
    #[error("mount option '{name}': {message}")]
    BadValue { name: String, message: String },
    #[error("mount option '{0}' needs a value (name=value)")]
    MissingValue(String),
}

/// Whether to mount as `fuseblk` (over a loop device), whose `umount` waits for the
/// daemon to finish writing back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlkdevMode {
    /// `fuseblk` where possible (root, a loop device to be had, no `fsname=`), else `fuse`.
    #[default]
    Auto,
    /// `fuseblk` or fail (`-o blkdev`).
    Always,
    /// Plain `fuse` (`-o noblkdev`).
    Never,
}

/// Settings of the FUSE session.
#[derive(Debug, Clone, PartialEq)]
pub struct FuseSettings {
    pub blkdev: BlkdevMode,
    pub allow_other: bool,
    pub allow_root: bool,
    pub worker_threads: usize,
    pub clone_fd: bool,
    /// The longest a reading worker spins for its next request before it sleeps.
    pub request_spin: Duration,
    pub writeback_cache: bool,
    pub max_write_bytes: u32,
    /// Readahead window set on the mount after the handshake; 0 keeps the kernel's.
    pub readahead_bytes: u64,
    /// Share of the kernel's dirty page limit, in percent (`dirty_ratio=`; 0: the
    /// kernel's own 1%).
    pub dirty_ratio: u8,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    /// Kernel mount flags passed through: nodev, nosuid, noexec, sync, dirsync.
    pub kernel_flags: KernelFlags,
    pub fsname: Option<String>,
    /// Serve requests over io_uring: asked for (`-o uring`), where the kernel offers it
    /// (`-o uring=auto`), or never (`-o nouring`, the default).
    pub uring: crate::uring::UringMode,
    /// Ring entries per queue worker (`uring_queue_depth=`).
    pub uring_queue_depth: u32,
    /// Worker threads (each with its own ring) per queue (`uring_queue_threads=`).
    pub uring_queue_threads: u16,
}

/// The generic mount flags the kernel applies. Each pair is decided by the last option
/// naming it, as mount(8) and every kernel filesystem do (`-o suid,nosuid` is nosuid), so
/// an fstab line and a command line that disagree mount with the command line's choice.
/// `None` leaves fuser's default: nodev and nosuid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelFlags {
    pub dev: Option<bool>,
    pub suid: Option<bool>,
    pub exec: Option<bool>,
    pub sync: Option<bool>,
    pub dirsync: bool,
}

impl KernelFlags {
    /// The flags as fuser mount options, one per decided pair.
    pub fn mount_options(&self) -> Vec<fuser::MountOption> {
        use fuser::MountOption as M;
        let pairs = [
            (self.dev, M::Dev, M::NoDev),
            (self.suid, M::Suid, M::NoSuid),
            (self.exec, M::Exec, M::NoExec),
            (self.sync, M::Sync, M::Async),
        ];
        let mut options: Vec<M> = pairs
            .into_iter()
            .filter_map(|(set, on, off)| set.map(|on_wanted| if on_wanted { on } else { off }))
            .collect();
        if self.dirsync {
            options.push(M::DirSync);
        }
        options
    }
}

/// Everything a mount needs, parsed from `-o` and the command line.
#[derive(Debug, Clone)]
pub struct MountConfig {
    pub fs: MountOptions,
    pub fuse: FuseSettings,
    /// Background log destination; `None` = syslog.
    pub log_file: Option<PathBuf>,
}

impl Default for MountConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            fs: MountOptions {
                data_cache: data_cache_default(),
                ..MountOptions::default()
            },
            fuse: FuseSettings {
                blkdev: BlkdevMode::Auto,
                allow_other: false,
                allow_root: false,
                worker_threads: cores.clamp(1, THREADS_DEFAULT_MAX),
                clone_fd: true,
                request_spin: REQUEST_SPIN_DEFAULT,
                writeback_cache: true,
                max_write_bytes: MAX_WRITE_DEFAULT_BYTES,
                readahead_bytes: READAHEAD_DEFAULT_BYTES,
                dirty_ratio: DIRTY_RATIO_DEFAULT,
                attr_timeout: TIMEOUT_DEFAULT,
                entry_timeout: TIMEOUT_DEFAULT,
                kernel_flags: KernelFlags::default(),
                fsname: None,
                uring: crate::uring::UringMode::default(),
                uring_queue_depth: crate::uring::QUEUE_DEPTH_DEFAULT,
                uring_queue_threads: crate::uring::QUEUE_THREADS_DEFAULT,
            },
            log_file: None,
        }
    }
}

/// Options mount(8), fstab and mount.fuse3 may pass that mean nothing to the daemon.
const IGNORED: [&str; 14] = [
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "nofail",
    "_netdev",
    "loop",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
];

/// Options that take a value.
const VALUE_OPTIONS: [&str; 18] = [
    "logmode",
    "commit",
    "cache_size",
    "data_cache",
    "read_buffers",
    "allocsize",
    "threads",
    "spin_us",
    "max_write",
    "readahead",
    "dirty_ratio",
    "attr_timeout",
    "entry_timeout",
    "logfile",
    "fsname",
    "uring",
    "uring_queue_depth",
    "uring_queue_threads",
];

impl MountConfig {
    /// Parses comma-separated option lists (several `-o` arguments add up).
    pub fn parse<'a>(lists: impl IntoIterator<Item = &'a str>) -> Result<Self, OptionError> {
        let mut config = Self::default();
        for list in lists {
            for option in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
                config.apply(option)?;
            }
        }
        Ok(config)
    }

    fn apply(&mut self, option: &str) -> Result<(), OptionError> {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option, None),
        };
        if self.apply_flag(name, value.is_some())? {
            return Ok(());
        }
        let Some(value) = value else {
            return Err(match VALUE_OPTIONS.contains(&name) {
                true => OptionError::MissingValue(name.to_string()),
                false => OptionError::Unknown(name.to_string()),
            });
        };
        self.apply_value(name, value)
    }

    /// A valueless option; returns whether `name` was one.
    fn apply_flag(&mut self, name: &str, has_value: bool) -> Result<bool, OptionError> {
        if has_value {
            return Ok(false);
        }
        let fuse = &mut self.fuse;
        match name {
            "ro" => self.fs.read_only = true,
            "rw" => self.fs.read_only = false,
            "noatime" => self.fs.atime = AtimeMode::Noatime,
            "relatime" | "atime" => self.fs.atime = AtimeMode::Relatime,
            "strictatime" => self.fs.atime = AtimeMode::Strict,
            "recover" => self.fs.recover_read_only = true,
            "buffered" => self.fs.buffered = true,
            "discard" => self.fs.discard = true,
            "nodiscard" => self.fs.discard = false,
            "blkdev" => fuse.blkdev = BlkdevMode::Always,
            "noblkdev" => fuse.blkdev = BlkdevMode::Never,
            "allow_other" => fuse.allow_other = true,
            "allow_root" => fuse.allow_root = true,
            // Always on: the kernel checks permissions from the attributes this daemon
            // returns (the filesystem checks again where it changes something).
            "default_permissions" => {}
            "writeback_cache" => fuse.writeback_cache = true,
            "no_writeback_cache" => fuse.writeback_cache = false,
            "clone_fd" => fuse.clone_fd = true,
            "noclone_fd" => fuse.clone_fd = false,
            "dev" | "nodev" => fuse.kernel_flags.dev = Some(name == "dev"),
            "suid" | "nosuid" => fuse.kernel_flags.suid = Some(name == "suid"),
            "exec" | "noexec" => fuse.kernel_flags.exec = Some(name == "exec"),
            "sync" | "async" => fuse.kernel_flags.sync = Some(name == "sync"),
            "dirsync" => fuse.kernel_flags.dirsync = true,
            "uring" => fuse.uring = crate::uring::UringMode::On,
            "nouring" => fuse.uring = crate::uring::UringMode::Off,
            _ if IGNORED.contains(&name) || name.starts_with("x-") => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn apply_value(&mut self, name: &str, value: &str) -> Result<(), OptionError> {
        let bad = |message: String| OptionError::BadValue {
            name: name.to_string(),
            message,
        };
        match name {
            "logmode" => self.fs.log_mode = parse_log_mode(value).map_err(bad)?,
            "commit" => self.fs.commit_interval_ms = parse_commit(value).map_err(bad)?,
            "cache_size" => self.fs.cache_bytes = Some(parse_size(value).map_err(bad)?),
            "data_cache" => self.fs.data_cache = parse_size(value).map_err(bad)?,
            "read_buffers" => self.fs.read_buffers = parse_size(value).map_err(bad)?,
            "allocsize" => self.fs.alloc_size = Some(parse_alloc_size(value).map_err(bad)?),
            "threads" => self.fuse.worker_threads = parse_threads(value).map_err(bad)?,
            "spin_us" => self.fuse.request_spin = parse_spin(value).map_err(bad)?,
            "max_write" => self.fuse.max_write_bytes = parse_max_write(value).map_err(bad)?,
            "readahead" => self.fuse.readahead_bytes = parse_readahead(value).map_err(bad)?,
            "dirty_ratio" => self.fuse.dirty_ratio = parse_dirty_ratio(value).map_err(bad)?,
            "attr_timeout" => self.fuse.attr_timeout = parse_seconds(value).map_err(bad)?,
            "entry_timeout" => self.fuse.entry_timeout = parse_seconds(value).map_err(bad)?,
            "logfile" => self.log_file = Some(PathBuf::from(value)),
            "fsname" => self.fuse.fsname = Some(value.to_string()),
            "uring" => self.fuse.uring = parse_uring_mode(value).map_err(bad)?,
            "uring_queue_depth" => {
                self.fuse.uring_queue_depth = parse_queue_depth(value).map_err(bad)?;
            }
            "uring_queue_threads" => {
                self.fuse.uring_queue_threads = parse_queue_threads(value).map_err(bad)?;
            }
            // mount(8) passes these through; they mean nothing here.
            "comment" | "subtype" | "context" | "fscontext" | "rootcontext" => {}
            _ if name.starts_with("x-") => {}
            _ => return Err(OptionError::Unknown(format!("{name}={value}"))),
        }
        Ok(())
    }
}

fn parse_log_mode(value: &str) -> Result<LogMode, String> {
    match value {
        "delayed" => Ok(LogMode::Delayed),
        "sync" => Ok(LogMode::Sync),
        _ => Err(format!("'{value}' is not a log mode (delayed or sync)")),
    }
}

/// `commit=SECONDS`, the commit window (whole or fractional seconds, as ext4's `commit=`
/// takes whole ones); 0 means the default, as on ext4.
fn parse_commit(value: &str) -> Result<u64, String> {
    let most = COMMIT_MAX.as_secs();
    match value.parse::<f64>() {
        Ok(0.0) => Ok(cairn_fs::COMMIT_INTERVAL_MS_DEFAULT),
        Ok(seconds) if seconds.is_finite() && (0.01..=most as f64).contains(&seconds) => {
            Ok((seconds * 1000.0).round() as u64)
        }
        _ => Err(format!(
            "'{value}' is not a number of seconds (0.01 to {most}; 0 for the default)"
        )),
    }
}

fn parse_alloc_size(value: &str) -> Result<u64, String> {
    let bytes = parse_size(value)?;
    if bytes == 0 || !bytes.is_power_of_two() {
        return Err(format!("'{value}' is not a power of two"));
    }
    Ok(bytes)
}

fn parse_threads(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(count) if (1..=THREADS_MAX).contains(&count) => Ok(count),
        _ => Err(format!(
            "'{value}' is not a thread count (1 to {THREADS_MAX})"
        )),
    }
}

fn parse_spin(value: &str) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(micros) if micros <= REQUEST_SPIN_MAX_US => Ok(Duration::from_micros(micros)),
        _ => Err(format!(
            "'{value}' is not a spin in microseconds (0 to {REQUEST_SPIN_MAX_US})"
        )),
    }
}

fn parse_uring_mode(value: &str) -> Result<crate::uring::UringMode, String> {
    use crate::uring::UringMode;
    match value {
        "auto" => Ok(UringMode::Auto),
        "on" => Ok(UringMode::On),
        "off" => Ok(UringMode::Off),
        _ => Err(format!("'{value}' is not auto, on or off")),
    }
}

fn parse_queue_depth(value: &str) -> Result<u32, String> {
    let most = crate::uring::QUEUE_DEPTH_MAX;
    match value.parse::<u32>() {
        Ok(depth) if (1..=most).contains(&depth) => Ok(depth),
        _ => Err(format!("'{value}' is not a queue depth (1 to {most})")),
    }
}

fn parse_queue_threads(value: &str) -> Result<u16, String> {
    let most = crate::uring::QUEUE_THREADS_MAX;
    match value.parse::<u16>() {
        Ok(threads) if (1..=most).contains(&threads) => Ok(threads),
        _ => Err(format!("'{value}' is not a thread count (1 to {most})")),
    }
}

fn parse_max_write(value: &str) -> Result<u32, String> {
    let bytes = parse_size(value)?;
    match u32::try_from(bytes) {
        Ok(bytes) if (4096..=MAX_WRITE_MAX_BYTES).contains(&bytes) => Ok(bytes),
        _ => Err(format!("'{value}' is not between 4K and 16M")),
    }
}

fn parse_readahead(value: &str) -> Result<u64, String> {
    match parse_size(value)? {
        bytes if bytes <= READAHEAD_MAX_BYTES => Ok(bytes),
        _ => Err(format!("'{value}' is more than 256M")),
    }
}

fn parse_dirty_ratio(value: &str) -> Result<u8, String> {
    match value.parse::<u8>() {
        Ok(percent) if percent <= 100 => Ok(percent),
        _ => Err(format!("'{value}' is not a percentage (0 to 100)")),
    }
}

fn parse_seconds(value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && (0.0..=86_400.0).contains(&seconds) => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(format!("'{value}' is not a number of seconds (0 to 86400)")),
    }
}

/// `DATA_CACHE_DEFAULT_BYTES`, or an eighth of the memory if that is less.
fn data_cache_default() -> u64 {
    // SAFETY: sysconf reads a system value; it has no preconditions.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let memory = u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page_size).unwrap_or(0));
    match memory {
        0 => DATA_CACHE_DEFAULT_BYTES,
        memory => DATA_CACHE_DEFAULT_BYTES.min(memory / 8),
    }
}

/// Every `-o` option with its meaning, for `--help` and the man page.
pub const OPTION_HELP: &[(&str, &str)] = &[
    ("ro / rw", "mount read-only / read-write (default rw)"),
    (
        "logmode=delayed|sync",
        "delayed logging (default) or a checkpoint per commit",
    ),
    (
        "commit=SECONDS",
        "what the daemon received this long ago is durable without fsync (default 5)",
    ),
    (
        "cache_size=SIZE",
        "memory limit of the metadata buffer cache",
    ),
    (
        "data_cache=SIZE",
        "write-behind cache for file data, 0 writes through (default 256M)",
    ),
    (
        "read_buffers=SIZE",
        "memory for reads at the device and read-ahead, 0 reads synchronously (default 64M)",
    ),
    (
        "allocsize=SIZE",
        "fixed preallocation beyond EOF (a power of two; default dynamic)",
    ),
    (
        "relatime / noatime / strictatime",
        "access time updates (default relatime)",
    ),
    ("recover", "allow log recovery on a read-only mount"),
    (
        "buffered",
        "open the device through the page cache instead of O_DIRECT",
    ),
    (
        "allow_other / allow_root",
        "let other users (or root) use the mount",
    ),
    (
        "default_permissions",
        "kernel permission checks (always in effect)",
    ),
    (
        "threads=N",
        "FUSE worker threads (default: cores, at most 8)",
    ),
    (
        "spin_us=N",
        "a worker looks for the next request up to N us before it sleeps (default 50, \
         adapting below; 0: never)",
    ),
    ("noclone_fd", "share one /dev/fuse descriptor among workers"),
    ("no_writeback_cache", "disable the kernel writeback cache"),
    ("max_write=SIZE", "largest write request (default 1M)"),
    (
        "readahead=SIZE",
        "kernel readahead window of the mount (default 4M; 0: the kernel's 128K; root only)",
    ),
    (
        "dirty_ratio=PERCENT",
        "share of the kernel's dirty page limit the mount's unwritten file data may take \
         (default 10; 0: the kernel's 1% for FUSE; root only; not with buffered)",
    ),
    (
        "attr_timeout=SECS / entry_timeout=SECS",
        "kernel caching of attributes, names (10)",
    ),
    (
        "uring / uring=auto / nouring",
        "serve requests over io_uring (FUSE_OVER_IO_URING, Linux 6.14+ with the fuse \
         module's enable_uring on), one queue per CPU: uring falls back to /dev/fuse \
         saying why in the log; uring=auto uses the ring where the kernel offers it, \
         silently /dev/fuse otherwise; nouring reads /dev/fuse only (default nouring)",
    ),
    (
        "uring_queue_depth=N",
        "ring entries per queue worker, each with a max_write payload buffer (default 8)",
    ),
    (
        "uring_queue_threads=N",
        "worker threads per queue, each with its own ring (default 2)",
    ),
    ("logfile=PATH", "background log to PATH instead of syslog"),
    (
        "discard / nodiscard",
        "give freed extents back to the device (hole punch, BLKDISCARD) once their free \
         is durable (default nodiscard; cairn trim does it on demand)",
    ),
    (
        "blkdev / noblkdev",
        "fuseblk mount over a loop device, whose umount waits for the write-back \
         (default when root; falls back to fuse) / plain fuse mount",
    ),
    (
        "fsname=NAME",
        "source name shown in /proc/mounts (a plain fuse mount; default: the device path)",
    ),
    (
        "dev/nodev, suid/nosuid, exec/noexec, sync/async, dirsync",
        "passed to the kernel; the last of a pair wins (default nodev, nosuid)",
    ),
    (
        "defaults, auto, noauto, user, nofail, _netdev, lazytime, [no]diratime, x-*",
        "fstab and generic options, accepted and ignored",
    ),
];

/// The option table as plain text, one option a line.
pub fn option_help_text() -> String {
    let mut out = String::from("Mount options (-o, comma-separated):\n");
    for (name, meaning) in OPTION_HELP {
        out.push_str(&format!("  {name}\n      {meaning}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // commit= takes seconds (fractions too) and 0 for the default, as ext4's; nonsense,
    // negative and too long windows are refused with the option named.
    #[test]
    fn commit_window_parses_in_seconds() {
        let window = |list: &str| MountConfig::parse([list]).map(|c| c.fs.commit_interval_ms);
        assert_eq!(MountConfig::default().fs.commit_interval_ms, 5_000);
        assert_eq!(window("commit=1"), Ok(1_000));
        assert_eq!(window("commit=0.5"), Ok(500));
        assert_eq!(window("commit=60"), Ok(60_000));
        assert_eq!(window("commit=0"), Ok(cairn_fs::COMMIT_INTERVAL_MS_DEFAULT));
        for bad in [
            "commit=-1",
            "commit=x",
            "commit=3601",
            "commit=nan",
            "commit=0.001",
        ] {
            let error = window(bad).unwrap_err().to_string();
            assert!(error.contains("'commit'"), "{bad}: {error}");
        }
        assert!(matches!(
            window("commit"),
            Err(OptionError::MissingValue(_))
        ));
    }

    // Filesystem, FUSE and generic options land in the right fields; several lists add up.
    #[test]
    fn options_parse_into_their_fields() {
        let config = MountConfig::parse([
            "ro,logmode=sync,cache_size=64M,allocsize=1M,noatime,data_cache=0,read_buffers=8M",
            "allow_other,threads=2,max_write=512K,attr_timeout=0.5,nodev,defaults,x-systemd.foo",
            "readahead=8M",
        ])
        .unwrap();
        assert!(config.fs.read_only);
        assert_eq!(config.fs.log_mode, LogMode::Sync);
        assert_eq!(config.fs.cache_bytes, Some(64 << 20));
        assert_eq!(config.fs.alloc_size, Some(1 << 20));
        assert_eq!(config.fs.data_cache, 0);
        assert_eq!(config.fs.read_buffers, 8 << 20);
        assert_eq!(config.fs.atime, AtimeMode::Noatime);
        assert!(config.fuse.allow_other);
        assert_eq!(config.fuse.worker_threads, 2);
        assert_eq!(config.fuse.request_spin, REQUEST_SPIN_DEFAULT);
        let spin = MountConfig::parse(["spin_us=0"]).unwrap().fuse.request_spin;
        assert_eq!(spin, Duration::ZERO);
        assert!(MountConfig::parse(["spin_us=5000"]).is_err());
        assert_eq!(config.fuse.max_write_bytes, 512 << 10);
        assert_eq!(config.fuse.readahead_bytes, 8 << 20);
        assert!(MountConfig::parse(["readahead=512M"]).is_err());
        let dirty = MountConfig::parse(["dirty_ratio=0"])
            .unwrap()
            .fuse
            .dirty_ratio;
        assert_eq!(dirty, 0);
        assert!(MountConfig::parse(["dirty_ratio=101"]).is_err());
        assert!(MountConfig::parse(["dirty_ratio=half"]).is_err());
        assert_eq!(config.fuse.attr_timeout, Duration::from_millis(500));
        assert_eq!(
            config.fuse.kernel_flags.mount_options(),
            vec![fuser::MountOption::NoDev]
        );
        assert_eq!(config.fuse.blkdev, BlkdevMode::Auto);
        assert!(!config.fs.discard);
        assert!(MountConfig::parse(["discard"]).unwrap().fs.discard);
        let never = MountConfig::parse(["noblkdev"]).unwrap();
        assert_eq!(never.fuse.blkdev, BlkdevMode::Never);
        let ring = MountConfig::parse(["uring,uring_queue_depth=32,uring_queue_threads=2"]);
        let ring = ring.unwrap();
        assert_eq!(ring.fuse.uring, crate::uring::UringMode::On);
        assert_eq!(ring.fuse.uring_queue_depth, 32);
        assert_eq!(ring.fuse.uring_queue_threads, 2);
        let off = MountConfig::parse(["uring,nouring"]).unwrap();
        assert_eq!(off.fuse.uring, crate::uring::UringMode::Off);
        let auto = MountConfig::parse(["uring=auto"]).unwrap();
        assert_eq!(auto.fuse.uring, crate::uring::UringMode::Auto);
        let default = MountConfig::parse([""]).unwrap();
        assert_eq!(default.fuse.uring, crate::uring::UringMode::Off);
        assert!(MountConfig::parse(["uring=sometimes"]).is_err());
        assert_eq!(
            MountConfig::parse(["blkdev"]).unwrap().fuse.blkdev,
            BlkdevMode::Always
        );
    }

    // Later options override earlier ones, across -o lists too (fstab then command line).
    #[test]
    fn later_options_override_earlier_ones() {
        use fuser::MountOption as M;
        let config = MountConfig::parse([
            "allow_other,default_permissions,dev,suid,exec,sync,rw,noatime",
            "nosuid,nodev,dev,noexec,async,ro,strictatime,relatime",
        ])
        .unwrap();
        assert_eq!(
            config.fuse.kernel_flags.mount_options(),
            vec![M::Dev, M::NoSuid, M::NoExec, M::Async]
        );
        assert!(config.fs.read_only);
        assert_eq!(config.fs.atime, AtimeMode::Relatime);
        let config = MountConfig::parse(["ro,noatime,nosuid", "rw,atime,suid"]).unwrap();
        assert!(!config.fs.read_only);
        assert_eq!(config.fs.atime, AtimeMode::Relatime);
        assert_eq!(config.fuse.kernel_flags.mount_options(), vec![M::Suid]);
        let config = MountConfig::parse(["noatime,nodiratime,lazytime"]).unwrap();
        assert_eq!(config.fs.atime, AtimeMode::Noatime);
    }

    // Unknown names, bad values and missing values are refused with the option named.
    #[test]
    fn bad_options_are_refused() {
        let unknown = MountConfig::parse(["frobnicate"]).unwrap_err();
        assert_eq!(unknown, OptionError::Unknown("frobnicate".into()));
        assert!(matches!(
            MountConfig::parse(["logmode=fast"]),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            MountConfig::parse(["allocsize=3000"]),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            MountConfig::parse(["threads=0"]),
            Err(OptionError::BadValue { .. })
        ));
        for bad in [
            "depth=0",
            "depth=1025",
            "depth=x",
            "threads=0",
            "threads=17",
        ] {
            assert!(matches!(
                MountConfig::parse([format!("uring_queue_{bad}").as_str()]),
                Err(OptionError::BadValue { .. })
            ));
        }
        assert_eq!(
            MountConfig::parse(["cache_size"]).unwrap_err(),
            OptionError::MissingValue("cache_size".into())
        );
        assert!(MountConfig::parse(["ro=1"]).is_err());
    }

    // Defaults: read-write, delayed logging, writeback cache, 1 MiB writes, 1..=8 threads.
    #[test]
    fn defaults_are_the_documented_ones() {
        let config = MountConfig::parse([""]).unwrap();
        assert!(!config.fs.read_only);
        assert_eq!(config.fs.log_mode, LogMode::Delayed);
        assert!(config.fuse.writeback_cache);
        assert!(config.fs.data_cache > 0 && config.fs.data_cache <= DATA_CACHE_DEFAULT_BYTES);
        assert!(config.fuse.clone_fd);
        assert_eq!(config.fuse.max_write_bytes, MAX_WRITE_DEFAULT_BYTES);
        assert_eq!(config.fuse.readahead_bytes, READAHEAD_DEFAULT_BYTES);
        assert_eq!(config.fuse.dirty_ratio, DIRTY_RATIO_DEFAULT);
        assert!((1..=THREADS_DEFAULT_MAX).contains(&config.fuse.worker_threads));
    }
}
