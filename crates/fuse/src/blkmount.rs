//! `fuseblk` mounts, the kind the kernel unmounts synchronously: at `umount` (from
//! umount(8), `fusermount3 -u`, systemd or any `umount2` caller) it sends `FUSE_DESTROY` and
//! waits for the reply, which the daemon sends only once the filesystem is written back,
//! its log is clean and its device closed. A plain `fuse` mount gets no such request, so
//! its `umount` returns while the daemon is still writing.
//!
//! A `fuseblk` mount needs a block device as its source, which the kernel claims
//! exclusively. The daemon attaches a loop device over its own descriptor of the image file
//! or device (`LOOP_CONFIGURE` with autoclear) and mounts that: the kernel's claim is on the
//! loop device, the daemon keeps its own exclusive claim (lock or `O_EXCL`) of the real
//! device, and the loop device goes away by itself when the kernel releases it at the end
//! of the unmount. Only root may do this; the daemon falls back to a plain mount otherwise.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `LOOP_CTL_GET_FREE`: the number of a free loop device (created if needed).
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
/// `LOOP_CONFIGURE`: attach a backing file and set flags in one call (Linux 5.8).
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
/// Loop flags: read-only, and detach on last close.
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Free loop devices can be taken by another process between the query and the attach.
const LOOP_ATTACH_TRIES: usize = 8;
/// Block size the fuseblk superblock is given (it must be at least the loop device's
/// logical sector size and at most a page).
const FUSEBLK_BLOCK_SIZE: u32 = 4096;

/// `struct loop_info64` of linux/loop.h.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    size_limit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` of linux/loop.h.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// What the fuseblk mount is made with.
#[derive(Debug, Clone)]
pub struct BlkOptions {
    pub read_only: bool,
    /// Logical sector size of the device (the loop device gets the same).
    pub sector_size: u32,
    /// Kernel mount flags (`MS_*`) beyond read-only.
    pub flags: libc::c_ulong,
    /// Options after `fd=`, `rootmode=`, `user_id=`, `group_id=` and `blksize=`.
    pub data: Vec<String>,
    /// Shown as the loop device's backing name.
    pub device_path: PathBuf,
}

/// A live fuseblk mount of this daemon.
#[derive(Debug)]
pub struct BlkMount {
    pub mountpoint: PathBuf,
    /// The loop device it is mounted from.
    pub source: PathBuf,
    /// `major:minor` of the mounted superblock (from mountinfo), to recognise this mount
    /// later without a stat, which would wait for the daemon.
    dev: String,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// Attaches a free loop device over `backing`; returns it open (it is detached when the
/// last opener, in the end the mounted superblock, closes it).
fn attach_loop(backing: BorrowedFd<'_>, options: &BlkOptions) -> io::Result<(File, PathBuf)> {
    let control = File::options()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last_error = io::Error::other("no free loop device");
    for _ in 0..LOOP_ATTACH_TRIES {
        // SAFETY: an ioctl without an argument on an open descriptor.
        let number = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) })?;
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = File::options()
            .read(true)
            .write(!options.read_only)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        let config = loop_config(backing, options);
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, valid for the call.
        match check(unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) }) {
            Ok(_) => return Ok((device, path)),
            // Taken by someone else since GET_FREE: ask again.
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => last_error = error,
            Err(error) => return Err(error),
        }
    }
    Err(last_error)
}

fn loop_config(backing: BorrowedFd<'_>, options: &BlkOptions) -> LoopConfig {
    let mut flags = LO_FLAGS_AUTOCLEAR;
    if options.read_only {
        flags |= LO_FLAGS_READ_ONLY;
    }
    let mut file_name = [0u8; 64];
    let name = options.device_path.as_os_str().as_bytes();
    let len = name.len().min(file_name.len() - 1);
    file_name[..len].copy_from_slice(&name[..len]);
    LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: options.sector_size,
        info: LoopInfo64 {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            size_limit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags,
            file_name,
            crypt_name: [0; 64],
            encrypt_key: [0; 32],
            init: [0; 2],
        },
        reserved: [0; 8],
    }
}

/// The mount data of a fuseblk mount served through `fuse`.
fn mount_data(fuse: &OwnedFd, mountpoint: &Path, options: &BlkOptions) -> io::Result<String> {
    let mode = std::fs::metadata(mountpoint)?.mode();
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={mode:o},user_id={uid},group_id={gid},blksize={FUSEBLK_BLOCK_SIZE}",
        fuse.as_raw_fd()
    );
    for option in &options.data {
        data.push(',');
        data.push_str(option);
    }
    Ok(data)
}

/// Mounts a fuseblk filesystem on `mountpoint`, with a loop device over `device` as its
/// source; returns the `/dev/fuse` descriptor to serve (the kernel's INIT is waiting on
/// it) and the mount.
pub fn mount(
    device: BorrowedFd<'_>,
    mountpoint: &Path,
    options: &BlkOptions,
) -> io::Result<(OwnedFd, BlkMount)> {
    // mountinfo names mount points by their canonical path.
    let mountpoint = &std::fs::canonicalize(mountpoint)?;
    let (loop_device, source) = attach_loop(device, options)?;
    let fuse: OwnedFd = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?
        .into();
    let data = CString::new(mount_data(&fuse, mountpoint, options)?).map_err(io::Error::other)?;
    let mut flags = options.flags;
    if options.read_only {
        flags |= libc::MS_RDONLY;
    }
    let (source_c, target_c) = (c_path(&source)?, c_path(mountpoint)?);
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            c"fuseblk".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    })?;
    // The superblock holds the loop device now; closing ours lets autoclear detach it
    // when the superblock goes.
    drop(loop_device);
    let dev = mounted_device(mountpoint)
        .ok_or_else(|| io::Error::other("the new mount is missing from mountinfo"))?;
    let mount = BlkMount {
        mountpoint: mountpoint.to_owned(),
        source,
        dev,
    };
    Ok((fuse, mount))
}

/// `major:minor` of the topmost fuseblk.cairn mount on `mountpoint`, read from
/// /proc/self/mountinfo (a stat of the mount would wait for the daemon to answer).
fn mounted_device(mountpoint: &Path) -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = escape_mountinfo(mountpoint.to_str()?);
    // Fields: id parent major:minor root mountpoint options ... - fstype source super.
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|field| *field == "-")?;
        let fstype = fields.get(dash + 1)?;
        (fields.get(4) == Some(&wanted.as_str()) && *fstype == "fuseblk.cairn")
            .then(|| fields[2].to_string())
    })
}

/// A path as mountinfo writes it: space, tab, newline and backslash in octal.
fn escape_mountinfo(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

impl BlkMount {
    /// Unmounts (the kernel's `FUSE_DESTROY` then runs the filesystem's unmount, and this
    /// returns after it); a busy mount is detached lazily instead. Does nothing if
    /// something else is mounted there now.
    pub fn unmount(&self) -> io::Result<()> {
        if mounted_device(&self.mountpoint).as_ref() != Some(&self.dev) {
            return Ok(());
        }
        let target = c_path(&self.mountpoint)?;
        // SAFETY: `target` is NUL-terminated and outlives the calls.
        match check(unsafe { libc::umount2(target.as_ptr(), 0) }) {
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(%error, "unmount refused; detaching lazily");
                // SAFETY: as above.
                check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }
}
