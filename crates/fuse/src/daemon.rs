//! Mounting and running: open the filesystem, mount it through FUSE, go to the background
//! once the mount is live, serve until unmounted (by `umount`, `fusermount3 -u`, SIGTERM
//! or SIGINT), then unmount the filesystem cleanly so the next mount needs no recovery.
//!
//! Background mode forks before any thread exists. The child opens the device (so the
//! exclusive lock belongs to the process that serves it), mounts, and reports "mounted"
//! or the error text through a pipe; the parent prints the error, if any, and exits with
//! the matching status. That is the behaviour `mount.fuse3` expects of a mount helper.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_blockdev::{DeviceError, FileDevice, OpenOptions};
use cairn_fs::{Filesystem, FsError};
use fuser::{Config, MountOption, Session, SessionACL};

use crate::adapter::CairnFs;
use crate::logging::{self, LogTarget};
use crate::options::MountConfig;
use crate::stats::RequestStats;

/// What to mount where.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub device: PathBuf,
    pub mountpoint: PathBuf,
    pub config: MountConfig,
    pub foreground: bool,
}

/// Why a mount failed or ended badly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("{path}: {message}")]
    Mountpoint { path: PathBuf, message: String },
    #[error("{path} is in use: {holder}")]
    Busy { path: PathBuf, holder: String },
    #[error("{path} is not a cairn filesystem ({detail})")]
    NotCairn { path: PathBuf, detail: String },
    #[error(
        "{path}: the log needs recovery, which a read-only mount does not run; mount it \
         read-write once, or add -o recover to recover on this read-only mount"
    )]
    NeedsRecovery { path: PathBuf },
    #[error("{path}: {source}")]
    Fs {
        path: PathBuf,
        #[source]
        source: FsError,
    },
    #[error("mounting on {path}: {source}")]
    Fuse {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmounting the filesystem: {0}")]
    Unmount(#[source] FsError),
    #[error("starting the daemon: {0}")]
    Daemonize(#[source] io::Error),
}

/// Mounts as `request` says; returns when the filesystem has been unmounted (foreground)
/// or, in the parent of a background daemon, once the mount is live.
pub fn run(request: &MountRequest) -> Result<(), DaemonError> {
    check_mountpoint(&request.mountpoint)?;
    if request.foreground {
        let _ = logging::init(&LogTarget::Stderr);
        return serve(request, &mut None);
    }
    let (read_end, write_end) = pipe().map_err(DaemonError::Daemonize)?;
    // SAFETY: no thread has been started yet (this runs before any mount work), so the
    // child is a complete copy of a single-threaded process.
    match unsafe { libc::fork() } {
        -1 => Err(DaemonError::Daemonize(io::Error::last_os_error())),
        0 => {
            drop(read_end);
            child(request, write_end)
        }
        _ => {
            drop(write_end);
            wait_for_child(read_end)
        }
    }
}

/// The background daemon: new session, background logging, then serve.
fn child(request: &MountRequest, ready: OwnedFd) -> ! {
    // SAFETY: setsid has no memory-safety preconditions.
    unsafe { libc::setsid() };
    let target = match &request.config.log_file {
        Some(path) => LogTarget::File(path.clone()),
        None => LogTarget::Syslog,
    };
    let mut ready = Some(File::from(ready));
    if let Err(error) = logging::init(&target) {
        if let Some(pipe) = ready.as_mut() {
            let _ = write!(pipe, "opening the log: {error}");
        }
        std::process::exit(1);
    }
    let result = serve(request, &mut ready);
    if let Err(error) = &result {
        // Before the mount is live this reaches the waiting parent; afterwards the pipe
        // is closed and only the log has it.
        if let Some(pipe) = ready.as_mut() {
            let _ = write!(pipe, "{error}");
        }
        tracing::error!(%error, "cairn daemon stopping");
    }
    std::process::exit(i32::from(result.is_err()));
}

/// The parent: waits for "mounted" or an error text from the child.
fn wait_for_child(read_end: OwnedFd) -> Result<(), DaemonError> {
    let mut text = String::new();
    let _ = File::from(read_end).read_to_string(&mut text);
    if text.starts_with(READY) {
        return Ok(());
    }
    let message = if text.is_empty() {
        "the daemon exited before the mount was live (see the system log)".to_string()
    } else {
        text
    };
    Err(DaemonError::Daemonize(io::Error::other(message)))
}

const READY: &str = "mounted";

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn check_mountpoint(path: &Path) -> Result<(), DaemonError> {
    let message = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "is not a directory".to_string(),
        Err(error) => error.to_string(),
    };
    Err(DaemonError::Mountpoint {
        path: path.to_owned(),
        message,
    })
}

/// Opens the filesystem, mounts it, reports readiness through `ready`, serves until the
/// mount goes away, and unmounts the filesystem.
fn serve(request: &MountRequest, ready: &mut Option<File>) -> Result<(), DaemonError> {
    // Blocked before any thread starts, so every thread inherits the mask and only the
    // signal thread receives these.
    let signals = block_signals();
    let fs = Arc::new(open_filesystem(request)?);
    let requests = Arc::new(RequestStats::default());
    let config = &request.config;
    let adapter = CairnFs::new(
        Arc::clone(&fs),
        Arc::clone(&requests),
        config.fuse.clone(),
        config.fs.read_only,
    );
    let mut session = match Session::new(adapter, &request.mountpoint, &fuse_config(request)) {
        Ok(session) => session,
        Err(source) => {
            let _ = unmount_filesystem(fs);
            let path = request.mountpoint.clone();
            return Err(DaemonError::Fuse { path, source });
        }
    };
    tracing::info!(
        device = %request.device.display(),
        mountpoint = %request.mountpoint.display(),
        threads = config.fuse.worker_threads,
        "cairn mounted"
    );
    spawn_signal_thread(signals, session.unmount_callable(), &request.mountpoint);
    // Closing the pipe (dropping it here) is what lets the parent exit.
    if let Some(mut pipe) = ready.take() {
        let _ = pipe.write_all(READY.as_bytes());
        drop(pipe);
        detach_stdio();
    }
    let served = session.run();
    tracing::info!(mountpoint = %request.mountpoint.display(), "FUSE session ended");
    let unmounted = unmount_filesystem(fs);
    if let Err(source) = served {
        let path = request.mountpoint.clone();
        return Err(DaemonError::Fuse { path, source });
    }
    unmounted
}

/// Opens and mounts the filesystem core, naming the usual failures plainly.
fn open_filesystem(request: &MountRequest) -> Result<Filesystem, DaemonError> {
    let path = &request.device;
    let options = &request.config.fs;
    if options.read_only && !options.recover_read_only && needs_recovery(request)? {
        return Err(DaemonError::NeedsRecovery { path: path.clone() });
    }
    let fs = Filesystem::mount_path(path, request.config.fs.clone())
        .map_err(|error| classify(path, error))?;
    let report = fs.recovery_report();
    tracing::info!(device = %path.display(), recovery = ?report, "filesystem opened");
    Ok(fs)
}

/// Whether the log of the device needs recovery (checked read-only, before the mount).
fn needs_recovery(request: &MountRequest) -> Result<bool, DaemonError> {
    let path = &request.device;
    let open = OpenOptions::new().read_only(true);
    let open = if request.config.fs.buffered {
        open.buffered()
    } else {
        open
    };
    let device = FileDevice::open(path, &open).map_err(|error| classify(path, error.into()))?;
    Filesystem::needs_recovery(&device).map_err(|error| classify(path, error))
}

/// A mount error with the device path and, for a busy device or something that is not
/// cairn, a plain message.
fn classify(path: &Path, error: FsError) -> DaemonError {
    let path = path.to_owned();
    match error {
        FsError::Io { source, what } => match source.downcast::<DeviceError>() {
            Ok(device) => match *device {
                DeviceError::Busy { holder, .. } => DaemonError::Busy { path, holder },
                other => DaemonError::Fs {
                    path,
                    source: FsError::Io {
                        what,
                        source: Box::new(other),
                    },
                },
            },
            Err(source) => DaemonError::Fs {
                path,
                source: FsError::Io { what, source },
            },
        },
        FsError::Corrupt {
            structure: "superblock",
            detail,
            ..
        } => DaemonError::NotCairn { path, detail },
        source => DaemonError::Fs { path, source },
    }
}

/// Unmounts the filesystem core once the FUSE session, which held the other reference,
/// has ended.
fn unmount_filesystem(fs: Arc<Filesystem>) -> Result<(), DaemonError> {
    match Arc::try_unwrap(fs) {
        Ok(fs) => {
            fs.unmount().map_err(DaemonError::Unmount)?;
            tracing::info!("filesystem unmounted cleanly");
            Ok(())
        }
        Err(fs) => {
            // Unreachable while fuser drops the session before `run` returns; still make
            // everything durable rather than lose it.
            tracing::error!("filesystem still referenced at unmount; syncing instead");
            fs.sync().map_err(DaemonError::Unmount)
        }
    }
}

/// The fuser session configuration of `request`.
fn fuse_config(request: &MountRequest) -> Config {
    let settings = &request.config.fuse;
    let mut options = vec![
        MountOption::FSName(fsname(request)),
        // The kernel shows the type as fuse.cairn (fuser passes Subtype only to fusermount).
        MountOption::CUSTOM("subtype=cairn".to_string()),
        MountOption::DefaultPermissions,
    ];
    if request.config.fs.read_only {
        options.push(MountOption::RO);
    }
    if request.config.fs.atime == cairn_fs::AtimeMode::Noatime {
        options.push(MountOption::NoAtime);
    }
    options.extend(settings.kernel_flags.mount_options());
    let mut config = Config::default();
    config.mount_options = options;
    config.acl = if settings.allow_other {
        SessionACL::All
    } else if settings.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(settings.worker_threads);
    config.clone_fd = settings.clone_fd;
    config
}

/// The source shown in /proc/mounts: `fsname=` or the device's absolute path.
fn fsname(request: &MountRequest) -> String {
    if let Some(name) = &request.config.fuse.fsname {
        return name.clone();
    }
    let path = std::path::absolute(&request.device).unwrap_or_else(|_| request.device.clone());
    path.display().to_string()
}

/// Points stdin, stdout and stderr at /dev/null once the daemon is in the background.
fn detach_stdio() {
    let Ok(null) = File::options().read(true).write(true).open("/dev/null") else {
        return;
    };
    use std::os::fd::AsRawFd;
    for target in 0..3 {
        // SAFETY: dup2 onto the standard descriptors, which this process owns.
        unsafe { libc::dup2(null.as_raw_fd(), target) };
    }
}

/// SIGTERM, SIGINT and SIGHUP, blocked in the calling thread (and so in every thread it
/// starts afterwards).
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data that sigemptyset initialises.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Waits for a blocked signal and unmounts; the session then ends and `serve` unmounts
/// the filesystem. A busy mount is detached lazily: it goes once its last user leaves.
fn spawn_signal_thread(set: libc::sigset_t, mut unmounter: fuser::SessionUnmounter, at: &Path) {
    let mountpoint = at.to_owned();
    let spawned = std::thread::Builder::new()
        .name("cairn-signals".into())
        .spawn(move || {
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` and `signal` are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            tracing::info!(signal, "signal received; unmounting");
            if let Err(error) = unmounter.unmount() {
                tracing::warn!(%error, "unmount refused; detaching lazily");
                lazy_unmount(&mountpoint);
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "no signal thread: SIGTERM will not unmount");
    }
}

fn lazy_unmount(mountpoint: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        let error = io::Error::last_os_error();
        tracing::error!(%error, "lazy unmount failed");
    }
}
