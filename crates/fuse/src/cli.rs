//! The `cairn` command line: `cairn [-f] [-o OPTIONS] DEVICE MOUNTPOINT` (the form
//! `mount.fuse3` uses, so `mount -t fuse.cairn` and fstab work), `cairn stats MOUNTPOINT`,
//! `cairn sync PATH`, `cairn trim`, `cairn grow` and `cairn man DIR`.
//!
//! Exit status: 0 mounted (or the subcommand succeeded); 1 the mount or subcommand failed
//! (the message says why); 2 the command line was wrong.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::adapter::{GROW_XATTR_PREFIX, SYNC_XATTR, TRIM_XATTR_PREFIX};
use crate::daemon::{self, MountRequest};
use crate::options::{MountConfig, option_help_text};
use crate::stats::STATS_XATTR;

/// Mount a cairn filesystem through FUSE.
///
/// Returns once the mount is live and leaves the daemon serving it in the background
/// (-f keeps it in the foreground). umount, fusermount3 -u, SIGTERM and SIGINT unmount
/// cleanly. `cairn stats MOUNTPOINT` prints the daemon's counters.
#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    subcommand_negates_reqs = true,
    after_long_help = option_help_text()
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Mount options, comma-separated (may be given more than once).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Stay in the foreground and log to stderr.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Block device or image file holding a cairn filesystem.
    #[arg(required = true)]
    pub device: Option<PathBuf>,
    /// Directory to mount it on.
    #[arg(required = true)]
    pub mountpoint: Option<PathBuf>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print every subsystem's counters of a mounted cairn filesystem: as text for people,
    /// or as JSON or OpenMetrics for monitoring agents (names and units in the user guide).
    Stats {
        /// Where the filesystem is mounted.
        mountpoint: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        format: StatsFormat,
        /// Short for --format json.
        #[arg(long, conflicts_with = "format")]
        json: bool,
    },
    /// Make everything written to a mounted cairn filesystem durable, as sync(1) does on a
    /// kernel filesystem (which cannot reach a FUSE daemon): the kernel's dirty pages are
    /// handed to the daemon (syncfs), then the daemon writes its cached data back and forces
    /// its log. Any user who can reach the mount may run it.
    Sync {
        /// Where the filesystem is mounted (or any path on it).
        path: PathBuf,
    },
    /// Discard every free extent of a mounted cairn filesystem (as fstrim does): an image
    /// file gets the space back, a thin or SSD device hears that it is unused. Root only.
    Trim {
        /// Where the filesystem is mounted.
        mountpoint: PathBuf,
        /// Skip free extents shorter than this (bytes; K, M, G suffixes).
        #[arg(short = 'm', long, value_name = "SIZE", default_value = "0",
              value_parser = parse_minimum)]
        minimum: u64,
    },
    /// Grow a cairn filesystem to SIZE (default: the whole device or image): the last
    /// allocation group is extended and new ones are added, in one logged transaction. An
    /// image file shorter than SIZE is extended (sparse) first. Works on a mount point (the
    /// mounted filesystem, as xfs_growfs) or on an unmounted image or device. Root only.
    Grow {
        /// Mount point, or image file or block device of an unmounted filesystem.
        device: PathBuf,
        /// New size (bytes; K, M, G, T suffixes).
        #[arg(value_parser = parse_minimum)]
        size: Option<u64>,
    },
    /// Show or set the extent size hint of files or directories, as `xfs_io -c extsize`
    /// does on XFS: a file with a hint allocates space in whole units of it, and a
    /// directory's hint is passed on to the files and directories made in it (set it on a
    /// database's data directory before the files are made). Uses FS_IOC_FSSETXATTR.
    Extsize {
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Set the hint to SIZE (bytes; K, M, G suffixes; a multiple of the block size;
        /// 0 removes it). A file's hint can only change while it holds no data.
        #[arg(short = 's', long, value_name = "SIZE", value_parser = parse_minimum)]
        set: Option<u64>,
        /// The copy-on-write extent size hint instead, as `xfs_io -c cowextsize`: a write
        /// into blocks a file shares with a copy (after `cp`) copies whole units of it. It
        /// may change while the file holds data.
        #[arg(long)]
        cow: bool,
    },
    /// Write the man pages of cairn, mkfs.cairn and fsck.cairn into a directory.
    Man {
        /// Output directory (created if missing).
        #[arg(default_value = "docs/man")]
        dir: PathBuf,
    },
}

/// How `cairn stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsFormat {
    /// Sections of `name: value` lines and a table of requests.
    Text,
    /// One JSON object.
    Json,
    /// The OpenMetrics text format (Prometheus).
    Openmetrics,
}

/// Runs cairn with `args` (including the program name) and returns its exit status.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match &args.command {
        Some(Command::Stats {
            mountpoint,
            format,
            json,
        }) => print_stats(mountpoint, if *json { StatsFormat::Json } else { *format }),
        Some(Command::Sync { path }) => sync(path),
        Some(Command::Trim {
            mountpoint,
            minimum,
        }) => trim(mountpoint, *minimum),
        Some(Command::Grow { device, size }) => grow(device, *size),
        Some(Command::Extsize { paths, set, cow }) => crate::extsize::run(paths, *set, *cow),
        Some(Command::Man { dir }) => crate::man::write_all(dir)
            .map(|written| println!("wrote {}", written.join(", ")))
            .map_err(|e| format!("{}: {e}", dir.display())),
        None => return mount(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("cairn: {message}");
            ExitCode::from(1)
        }
    }
}

fn mount(args: &Args) -> ExitCode {
    let (Some(device), Some(mountpoint)) = (&args.device, &args.mountpoint) else {
        eprintln!("cairn: DEVICE and MOUNTPOINT are required");
        return ExitCode::from(2);
    };
    let config = match MountConfig::parse(args.options.iter().map(String::as_str)) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("cairn: {error}");
            return ExitCode::from(2);
        }
    };
    let request = MountRequest {
        device: device.clone(),
        mountpoint: mountpoint.clone(),
        config,
        foreground: args.foreground,
    };
    match daemon::run(&request) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cairn: {error}");
            ExitCode::from(1)
        }
    }
}

fn parse_minimum(text: &str) -> Result<u64, String> {
    cairn_mkfs::size::parse_size(text)
}

/// `cairn sync PATH`: `syncfs` on the mount holding `path`, so the kernel's dirty pages
/// reach the daemon, then the daemon's sync command on the mount's root.
fn sync(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let root = mount_root(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let directory =
        std::fs::File::open(&root).map_err(|error| format!("{}: {error}", root.display()))?;
    // SAFETY: syncfs on a descriptor this function owns.
    if unsafe { libc::syncfs(directory.as_raw_fd()) } != 0 {
        let error = std::io::Error::last_os_error();
        return Err(format!("{}: syncfs: {error}", root.display()));
    }
    read_root_xattr(&root, SYNC_XATTR).map_err(|error| match error.raw_os_error() {
        Some(libc::ENODATA | libc::EOPNOTSUPP) => {
            format!("{} is not on a cairn mount", path.display())
        }
        _ => format!("{}: {error} (see the daemon's log)", root.display()),
    })?;
    Ok(())
}

/// The root of the mount holding `path`: the highest directory above it on the same
/// device.
fn mount_root(path: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut root = std::fs::canonicalize(path)?;
    if !root.is_dir() {
        root.pop();
    }
    let device = std::fs::metadata(&root)?.dev();
    while let Some(parent) = root.parent() {
        if std::fs::metadata(parent)?.dev() != device {
            break;
        }
        root = parent.to_path_buf();
    }
    Ok(root)
}

/// Trims the free space of the cairn mount at `mountpoint` and prints what it discarded.
fn trim(mountpoint: &Path, minimum: u64) -> Result<(), String> {
    let name = format!("{TRIM_XATTR_PREFIX}{minimum}");
    let text = read_root_xattr(mountpoint, &name).map_err(|error| match error.raw_os_error() {
        Some(libc::ENODATA | libc::EOPNOTSUPP) => {
            format!("{} is not the root of a cairn mount", mountpoint.display())
        }
        Some(libc::EPERM) => "only root may trim a filesystem".to_string(),
        Some(libc::EROFS) => format!("{} is mounted read-only", mountpoint.display()),
        _ => format!("{}: {error}", mountpoint.display()),
    })?;
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (bytes, extents) = (field("trimmed_bytes:"), field("trimmed_extents:"));
    println!(
        "{}: {} ({bytes} bytes) trimmed in {extents} extents",
        mountpoint.display(),
        human_bytes(bytes)
    );
    Ok(())
}

/// Grows the filesystem mounted on, or held by, `path` to `size` bytes (the device's size
/// if `None`).
fn grow(path: &Path, size: Option<u64>) -> Result<(), String> {
    let report = match path.is_dir() {
        true => grow_mounted(path, size)?,
        false => grow_offline(path, size)?,
    };
    let (block_size, old, new) = (report.4, report.0, report.1);
    println!(
        "{}: grew from {old} to {new} blocks ({} to {}), {} to {} allocation groups",
        path.display(),
        human_bytes(old * block_size),
        human_bytes(new * block_size),
        report.2,
        report.3
    );
    Ok(())
}

/// (old blocks, new blocks, old AGs, new AGs, block size) of a grow.
type Grown = (u64, u64, u32, u32, u64);

/// Tries of a grow the daemon refuses because a deleted file is open, and the pause
/// between them: the kernel tells the daemon that a file was closed (`RELEASE`, then
/// `FORGET`) asynchronously, so a file closed just before the grow may still count.
const GROW_BUSY_TRIES: u32 = 20;
const GROW_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Grows the filesystem mounted on `mountpoint` through the daemon.
fn grow_mounted(mountpoint: &Path, size: Option<u64>) -> Result<Grown, String> {
    let name = format!("{GROW_XATTR_PREFIX}{}", size.unwrap_or(0));
    let mut outcome = read_root_xattr(mountpoint, &name);
    for _ in 1..GROW_BUSY_TRIES {
        match &outcome {
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(GROW_BUSY_PAUSE);
                outcome = read_root_xattr(mountpoint, &name);
            }
            _ => break,
        }
    }
    let text = outcome.map_err(|error| match error.raw_os_error() {
        Some(libc::ENODATA | libc::EOPNOTSUPP) => {
            format!("{} is not the root of a cairn mount", mountpoint.display())
        }
        Some(libc::EPERM) => "only root may grow a filesystem".to_string(),
        Some(libc::EBUSY) => format!(
            "{}: a deleted file is still open there; close it, or unmount and run cairn \
             grow on the image or device",
            mountpoint.display()
        ),
        Some(libc::EINVAL) => format!(
            "{}: the new size is not larger than the filesystem, or the device is not \
             larger (extend it first), or the mount is read-only",
            mountpoint.display()
        ),
        _ => format!("{}: {error} (see the daemon's log)", mountpoint.display()),
    })?;
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        field("old_blocks:"),
        field("new_blocks:"),
        field("old_ags:") as u32,
        field("new_ags:") as u32,
        field("block_size:"),
    ))
}

/// Grows the unmounted filesystem on the image or device `path`.
fn grow_offline(path: &Path, size: Option<u64>) -> Result<Grown, String> {
    let mut open = cairn_blockdev::OpenOptions::new();
    if let Some(size) = size {
        open = open.create_size(size);
    }
    let shown = |error: &dyn std::fmt::Display| format!("{}: {error}", path.display());
    let device = cairn_blockdev::FileDevice::open(path, &open).map_err(|e| shown(&e))?;
    let device: std::sync::Arc<dyn cairn_blockdev::BlockDevice> = std::sync::Arc::new(device);
    let fs = cairn_fs::Filesystem::mount(device, cairn_fs::MountOptions::default())
        .map_err(|e| shown(&e))?;
    let block_size = u64::from(fs.statfs().map_err(|e| shown(&e))?.block_size);
    let blocks = size.map_or(u64::MAX, |size| size / block_size);
    let report = fs.grow(blocks).map_err(|e| shown(&e))?;
    Ok((
        report.old_blocks,
        report.new_blocks,
        report.old_ags,
        report.new_ags,
        block_size,
    ))
}

/// `bytes` in the largest binary unit that keeps it at least 1.
pub(crate) fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", units[unit])
}

/// Prints the statistics of the cairn mount at `mountpoint` in `format`.
fn print_stats(mountpoint: &Path, format: StatsFormat) -> Result<(), String> {
    let name = match format {
        StatsFormat::Text => STATS_XATTR,
        StatsFormat::Json => crate::stats_export::STATS_JSON_XATTR,
        StatsFormat::Openmetrics => crate::stats_export::STATS_OPENMETRICS_XATTR,
    };
    let text = read_root_xattr(mountpoint, name).map_err(|error| {
        let cairn = error.raw_os_error() != Some(libc::ENODATA)
            && error.raw_os_error() != Some(libc::EOPNOTSUPP);
        match cairn {
            true => format!("{}: {error}", mountpoint.display()),
            false => format!("{} is not the root of a cairn mount", mountpoint.display()),
        }
    })?;
    print!("{text}");
    Ok(())
}

/// Reads the reserved statistics attribute of `mountpoint`.
pub fn read_stats(mountpoint: &Path) -> std::io::Result<String> {
    read_root_xattr(mountpoint, STATS_XATTR)
}

/// Reads the reserved attribute `name` of `mountpoint`, in one call when it fits 16 KiB
/// (a command such as the trim runs once per call).
fn read_root_xattr(mountpoint: &Path, name: &str) -> std::io::Result<String> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())?;
    let name = CString::new(name)?;
    // The text grows between the size query and the read; retry with a larger buffer.
    let mut capacity = 16 << 10;
    loop {
        let mut buf = vec![0u8; capacity];
        // SAFETY: path and name are NUL-terminated; buf has `capacity` writable bytes.
        let len = unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                capacity,
            )
        };
        if len >= 0 {
            buf.truncate(len as usize);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ERANGE) || capacity >= 1 << 20 {
            return Err(error);
        }
        capacity *= 4;
    }
}
