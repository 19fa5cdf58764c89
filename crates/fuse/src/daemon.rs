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

use std::os::fd::{AsFd, AsRawFd};

use cairn_blockdev::{BlockDevice, DeviceError, FileDevice, OpenOptions};
use cairn_fs::{Filesystem, FsError};
use fuser::{Config, MountOption, Session, SessionACL};

use crate::adapter::CairnFs;
use crate::blkmount::{self, BlkMount, BlkOptions};
use crate::core::{CoreSlot, Unmounted};
use crate::logging::{self, LogTarget};
use crate::options::{BlkdevMode, FuseSettings, MountConfig};
use crate::stats::RequestStats;
use crate::uring::{RingOffer, Rings, Transport};

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
    #[error("unmounting the filesystem: {0}")]
    UnmountFailed(String),
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
    let device = open_device(request)?;
    let core = CoreSlot::new(open_filesystem(request, &device)?);
    let requests = Arc::new(RequestStats::default());
    let rings = prepare_rings(request);
    // Resolved before the mount: afterwards the path's last step would wait for us.
    let mountpoint = std::fs::canonicalize(&request.mountpoint);
    let started = start_session(request, &core, &requests, &device, &rings.offer());
    // Only the filesystem holds the device from here: unmounting it releases the device.
    drop(device);
    let (session, unmounter) = match started {
        Ok(started) => started,
        Err(error) => {
            let _ = finish(&core);
            return Err(error);
        }
    };
    let transport = match start_transport(request, rings, &session, &core, &requests) {
        Ok(transport) => transport,
        Err(error) => {
            drop(session);
            let _ = finish(&core);
            return Err(error);
        }
    };
    requests.set_transport(transport.status());
    tracing::info!(
        device = %request.device.display(),
        mountpoint = %request.mountpoint.display(),
        source = %unmounter.source(),
        threads = request.config.fuse.worker_threads,
        "cairn mounted"
    );
    if let Ok(mountpoint) = mountpoint {
        let buffered = request.config.fs.buffered;
        set_bdi(&mountpoint, &request.config.fuse, buffered);
    }
    spawn_signal_thread(signals, unmounter);
    let describe = {
        let core = Arc::clone(&core);
        Box::new(move || match core.get() {
            Ok(fs) => fs.log_space_report(),
            Err(error) => error.to_string(),
        })
    };
    let watchdog = crate::watchdog::Watchdog::spawn(Arc::clone(&requests), describe);
    let background = crate::background::BackgroundThread::spawn(Arc::clone(&core));
    // Closing the pipe (dropping it here) is what lets the parent exit.
    if let Some(mut pipe) = ready.take() {
        let _ = pipe.write_all(READY.as_bytes());
        drop(pipe);
        detach_stdio();
    }
    let served = session.run();
    transport.finish();
    drop(background);
    drop(watchdog);
    tracing::info!(mountpoint = %request.mountpoint.display(), "FUSE session ended");
    let unmounted = finish(&core);
    if let Err(source) = served {
        let path = request.mountpoint.clone();
        return Err(DaemonError::Fuse { path, source });
    }
    unmounted
}

/// Widens the mount's readahead window and dirty share (see `bdi.rs`); without them (not
/// root, no sysfs) the mount works with the kernel's 128 KiB and 1%, only slower on
/// sequential reads and bursts of random writes. A device opened through the page cache
/// (`buffered`) keeps the 1%: the daemon's own writes would then be dirty pages too.
fn set_bdi(mountpoint: &Path, settings: &FuseSettings, buffered: bool) {
    let bdi = match crate::bdi::Bdi::of_mount(mountpoint) {
        Ok(bdi) => bdi,
        Err(error) => {
            tracing::info!(%error, "readahead window and dirty share left at the kernel's");
            return;
        }
    };
    let bytes = settings.readahead_bytes;
    if bytes > 0 {
        match bdi.set_readahead(bytes) {
            Ok(()) => tracing::debug!(bytes, "readahead window set"),
            Err(error) => tracing::info!(%error, "readahead window left at the kernel's default"),
        }
    }
    let percent = settings.dirty_ratio;
    if percent > 0 && !buffered {
        match bdi.set_dirty_ratio(percent) {
            Ok(()) => tracing::debug!(percent, "dirty share set"),
            Err(error) => tracing::info!(%error, "dirty share left at the kernel's default"),
        }
    }
}

/// Opens the image or device exclusively (read-only for a read-only mount).
fn open_device(request: &MountRequest) -> Result<Arc<FileDevice>, DaemonError> {
    let path = &request.device;
    let open = OpenOptions::new().read_only(request.config.fs.read_only);
    let open = match request.config.fs.buffered {
        true => open.buffered(),
        false => open,
    };
    FileDevice::open(path, &open)
        .map(Arc::new)
        .map_err(|error| classify(path, error.into()))
}

/// Mounts the filesystem core on `device` (recovery runs here), naming the usual
/// failures plainly. A read-only mount first checks the log and refuses to skip recovery.
fn open_filesystem(
    request: &MountRequest,
    device: &Arc<FileDevice>,
) -> Result<Filesystem, DaemonError> {
    let path = &request.device;
    let options = &request.config.fs;
    if options.read_only && !options.recover_read_only {
        let dirty = Filesystem::needs_recovery(device.as_ref()).map_err(|e| classify(path, e))?;
        if dirty {
            return Err(DaemonError::NeedsRecovery { path: path.clone() });
        }
    }
    let shared: Arc<dyn BlockDevice> = Arc::clone(device) as Arc<dyn BlockDevice>;
    let fs = Filesystem::mount(shared, options.clone()).map_err(|error| classify(path, error))?;
    let report = fs.recovery_report();
    tracing::info!(device = %path.display(), recovery = ?report, "filesystem opened");
    Ok(fs)
}

/// The io_uring rings (`-o uring`, or `-o uring=auto` where the kernel offers the ring),
/// set up before the handshake, which asks for the ring only if they are ready.
fn prepare_rings(request: &MountRequest) -> Rings<CairnFs> {
    let settings = &request.config.fuse;
    Rings::for_mode(
        settings.uring,
        settings.uring_queue_depth,
        settings.uring_queue_threads,
        settings.max_write_bytes,
    )
}

/// Starts serving over the rings if the handshake negotiated them (else says why, once,
/// where they were asked for or prepared): requests then go through a second front end
/// on the same core, with the session's decoding and access rules.
fn start_transport(
    request: &MountRequest,
    rings: Rings<CairnFs>,
    session: &Session<CairnFs>,
    core: &Arc<CoreSlot>,
    requests: &Arc<RequestStats>,
) -> Result<Transport, DaemonError> {
    let settings = request.config.fuse.clone();
    let mode = settings.uring;
    let read_only = request.config.fs.read_only;
    let adapter = CairnFs::new(Arc::clone(core), Arc::clone(requests), settings, read_only)
        .map_err(DaemonError::Unmount)?
        .with_reads_answered_in_handler();
    let fuse_fd = session.as_fd().as_raw_fd();
    Ok(rings.start(fuse_fd, session.dispatcher(adapter), mode))
}

/// Mounts through FUSE and completes the handshake: as `fuseblk` over a loop device where
/// the options and the system allow (see `blkmount`), else as a plain `fuse` mount.
fn start_session(
    request: &MountRequest,
    core: &Arc<CoreSlot>,
    requests: &Arc<RequestStats>,
    device: &Arc<FileDevice>,
    ring: &Arc<RingOffer>,
) -> Result<(Session<CairnFs>, Unmounter), DaemonError> {
    let settings = &request.config.fuse;
    let adapter = || {
        let (settings, read_only) = (settings.clone(), request.config.fs.read_only);
        CairnFs::new(Arc::clone(core), Arc::clone(requests), settings, read_only)
            .map(|adapter| adapter.with_ring(Arc::clone(ring)))
            .map_err(DaemonError::Unmount)
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let wanted = match settings.blkdev {
        BlkdevMode::Never => false,
        BlkdevMode::Always => true,
        BlkdevMode::Auto => root && settings.fsname.is_none(),
    };
    let path = request.mountpoint.clone();
    if wanted {
        match blk_session(request, adapter()?, device) {
            Ok(started) => return Ok(started),
            Err(source) if settings.blkdev == BlkdevMode::Always => {
                return Err(DaemonError::Fuse { path, source });
            }
            Err(error) => tracing::warn!(
                %error,
                "no fuseblk mount; mounting as fuse.cairn, whose umount returns before the \
                 daemon has written everything back"
            ),
        }
    }
    let mut session = Session::new(adapter()?, &request.mountpoint, &fuse_config(request))
        .map_err(|source| DaemonError::Fuse { path, source })?;
    let unmounter = Unmounter::Fuse(session.unmount_callable(), request.mountpoint.clone());
    Ok((session, unmounter))
}

/// A fuseblk mount over a loop device on `device`, and its session after the handshake.
fn blk_session(
    request: &MountRequest,
    adapter: CairnFs,
    device: &Arc<FileDevice>,
) -> io::Result<(Session<CairnFs>, Unmounter)> {
    let options = BlkOptions {
        read_only: request.config.fs.read_only,
        sector_size: device.logical_sector_size(),
        flags: kernel_flags(request),
        data: mount_data(request),
        device_path: std::path::absolute(&request.device).unwrap_or_default(),
    };
    let (fuse, mount) = blkmount::mount(device.as_fd(), &request.mountpoint, &options)?;
    let config = fuse_config(request);
    match Session::from_fd(adapter, fuse, config.acl, config) {
        Ok(session) => Ok((session, Unmounter::Blk(mount))),
        Err(error) => {
            // The descriptor is closed, so the kernel sends no FUSE_DESTROY to wait for.
            let _ = mount.unmount();
            Err(error)
        }
    }
}

/// `MS_*` flags of a fuseblk mount: nodev and nosuid unless asked otherwise (as fuser does
/// for its mounts), and the flags among the options.
fn kernel_flags(request: &MountRequest) -> libc::c_ulong {
    let kernel = &request.config.fuse.kernel_flags;
    let mut flags = 0;
    if kernel.dev != Some(true) {
        flags |= libc::MS_NODEV;
    }
    if kernel.suid != Some(true) {
        flags |= libc::MS_NOSUID;
    }
    if kernel.exec == Some(false) {
        flags |= libc::MS_NOEXEC;
    }
    if kernel.sync == Some(true) {
        flags |= libc::MS_SYNCHRONOUS;
    }
    if kernel.dirsync {
        flags |= libc::MS_DIRSYNC;
    }
    if request.config.fs.atime == cairn_fs::AtimeMode::Noatime {
        flags |= libc::MS_NOATIME;
    }
    flags
}

/// Options of a fuseblk mount beyond the descriptor, root mode, owner and block size.
fn mount_data(request: &MountRequest) -> Vec<String> {
    let settings = &request.config.fuse;
    let mut data = vec![
        "subtype=cairn".to_string(),
        "default_permissions".to_string(),
    ];
    if settings.allow_other || settings.allow_root {
        // The kernel knows only allow_other; fuser refuses other users for allow_root.
        data.push("allow_other".to_string());
    }
    data
}

/// Unmounts the core unless `FUSE_DESTROY` already did, and reports how that went.
fn finish(core: &CoreSlot) -> Result<(), DaemonError> {
    if let Some(fs) = core.take() {
        fs.unmount().map_err(DaemonError::Unmount)?;
        tracing::info!("filesystem unmounted cleanly");
        return Ok(());
    }
    match core.unmounted() {
        Unmounted::Failed(message) => Err(DaemonError::UnmountFailed(message)),
        Unmounted::Clean | Unmounted::No => Ok(()),
    }
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
    config.request_spin = settings.request_spin;
    // READs with requests waiting behind them go to the device's completion thread
    // (`Filesystem::read_handed_over`), so their worker is back at once.
    config.reads_handed_over = request.config.fs.read_buffers > 0;
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

/// How the daemon takes its own mount down (on SIGTERM or SIGINT).
enum Unmounter {
    /// A plain fuse mount: fuser's unmounter, and the mount point for a lazy detach.
    Fuse(fuser::SessionUnmounter, PathBuf),
    /// A fuseblk mount: `umount2` waits for `FUSE_DESTROY`, which unmounts the core.
    Blk(BlkMount),
}

impl Unmounter {
    /// What the kernel shows as the mount's source.
    fn source(&self) -> String {
        match self {
            Unmounter::Fuse(..) => "fuse".to_string(),
            Unmounter::Blk(mount) => format!("fuseblk on {}", mount.source.display()),
        }
    }

    fn unmount(self) {
        match self {
            Unmounter::Fuse(mut unmounter, mountpoint) => {
                if let Err(error) = unmounter.unmount() {
                    tracing::warn!(%error, "unmount refused; detaching lazily");
                    lazy_unmount(&mountpoint);
                }
            }
            Unmounter::Blk(mount) => {
                if let Err(error) = mount.unmount() {
                    tracing::error!(%error, "unmount failed");
                }
            }
        }
    }
}

/// Waits for a blocked signal and unmounts; the session then ends and `serve` unmounts
/// the filesystem (or `FUSE_DESTROY` did). A busy mount is detached lazily: it goes once
/// its last user leaves.
fn spawn_signal_thread(set: libc::sigset_t, unmounter: Unmounter) {
    let spawned = std::thread::Builder::new()
        .name("cairn-signals".into())
        .spawn(move || {
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` and `signal` are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            tracing::info!(signal, "signal received; unmounting");
            unmounter.unmount();
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
