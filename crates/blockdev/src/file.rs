//! `FileDevice`: an image file or a raw block device, opened for `O_DIRECT` positional I/O.
//!
//! Exclusive access: block devices are opened with `O_EXCL` (the kernel refuses a second
//! exclusive open and any open while mounted); image files take a POSIX record lock on the whole
//! file (shared for read-only opens). A process-wide registry refuses a second conflicting open
//! in the same process, which POSIX locks alone would allow. Caveat of POSIX locks: closing
//! *any* descriptor of the image in this process drops the lock, so code that opens an image
//! must do so only through `FileDevice` while one is live.

use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::batch::{BatchTarget, RingPool};
use crate::claim::{self, Claim, LockError};
use crate::mem::check_geometry;
use crate::reads::ReadEngine;
use crate::{
    AlignedBuf, BUFFER_ALIGN, BatchWrite, BlockDevice, DeviceError, ReadDone, ReadJob, bounce_read,
    check_transfer, sys, write_zero_buffers,
};

/// Logical sector size of an image file unless the options say otherwise.
pub const IMAGE_SECTOR_SIZE_DEFAULT: u32 = 4096;
/// Physical sector size reported for image files: the page size, which the page cache and most
/// host filesystems write as a unit.
pub const IMAGE_PHYSICAL_SECTOR_SIZE: u32 = 4096;

/// How to open a `FileDevice`. `OpenOptions::default()` is read-write with `O_DIRECT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open read-only: writes and discards are refused with `ReadOnly`.
    pub read_only: bool,
    /// Use `O_DIRECT` (the default). When false, I/O goes through the page cache and `flush`
    /// is `fdatasync`, which is still a correct durability barrier, only slower for large I/O.
    pub direct: bool,
    /// Logical sector size: for image files a power of two in 512..=4096 (default 4096); for
    /// block devices a multiple of the device's own logical sector size (default: that size).
    pub sector_size: Option<u32>,
    /// Create the image file if missing, and extend it (sparse) to at least this many bytes.
    pub create_size: Option<u64>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            direct: true,
            sector_size: None,
            create_size: None,
        }
    }
}

impl OpenOptions {
    /// Read-write, `O_DIRECT`, default sector size, no creation.
    pub fn new() -> Self {
        Self::default()
    }

    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    #[must_use]
    pub fn direct(mut self, direct: bool) -> Self {
        self.direct = direct;
        self
    }

    /// Shorthand for `direct(false)`: buffered I/O, for filesystems that refuse `O_DIRECT`.
    #[must_use]
    pub fn buffered(self) -> Self {
        self.direct(false)
    }

    #[must_use]
    pub fn sector_size(mut self, sector_size: u32) -> Self {
        self.sector_size = Some(sector_size);
        self
    }

    #[must_use]
    pub fn create_size(mut self, size_bytes: u64) -> Self {
        self.create_size = Some(size_bytes);
        self
    }
}

/// What the path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    ImageFile,
    BlockDevice,
}

/// An open image file or block device; safe to share between threads (`pread`/`pwrite`).
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    kind: DeviceKind,
    /// Changes only by `grow_to` (upward).
    size_bytes: std::sync::atomic::AtomicU64,
    logical_sector_size: u32,
    physical_sector_size: u32,
    read_only: bool,
    direct: bool,
    /// Held for the registry entry's lifetime; released when the device drops.
    _claim: Claim,
    /// The io_uring instances `write_batch` uses.
    rings: RingPool,
    /// `read_async`'s completion thread, started on first use (`None` inside: io_uring or
    /// an eventfd refused, so reads are synchronous).
    reads: OnceLock<Option<ReadEngine>>,
}

fn open_error(path: &Path, source: io::Error) -> DeviceError {
    DeviceError::Open {
        path: path.to_owned(),
        source,
    }
}

fn io_error(op: &'static str, offset: u64, len: u64, source: io::Error) -> DeviceError {
    DeviceError::Io {
        op,
        offset,
        len,
        source,
    }
}

fn kind_of(path: &Path, meta: &Metadata) -> Result<DeviceKind, DeviceError> {
    let file_type = meta.file_type();
    if file_type.is_file() {
        Ok(DeviceKind::ImageFile)
    } else if file_type.is_block_device() {
        Ok(DeviceKind::BlockDevice)
    } else {
        Err(DeviceError::NotADevice {
            path: path.to_owned(),
        })
    }
}

fn busy(path: &Path, holder: String) -> DeviceError {
    DeviceError::Busy {
        path: path.to_owned(),
        holder,
    }
}

fn claim_or_busy(path: &Path, meta: &Metadata, read_only: bool) -> Result<Claim, DeviceError> {
    Claim::acquire((meta.dev(), meta.ino()), read_only).ok_or_else(|| {
        let pid = std::process::id();
        busy(path, format!("already open in this process (pid {pid})"))
    })
}

impl FileDevice {
    /// Opens `path` as described by `options`; see the module documentation for exclusivity.
    ///
    /// Errors: `Open` (missing file, permissions), `NotADevice`, `DirectIoUnsupported` (the
    /// filesystem refuses `O_DIRECT`), `Busy` (another opener, named where possible),
    /// `Geometry` (bad sector or create size), `Io` (ioctl or resize failures).
    pub fn open(path: impl AsRef<Path>, options: &OpenOptions) -> Result<FileDevice, DeviceError> {
        let path = path.as_ref();
        Self::check_options(options)?;
        let creating = options.create_size.is_some() && !options.read_only;
        // Claim before opening when the file exists: see `claim` on why a refused open must not
        // open (and so close) the file.
        let early_claim = match fs::metadata(path) {
            Ok(meta) => {
                let kind = kind_of(path, &meta)?;
                Some((kind, claim_or_busy(path, &meta, options.read_only)?))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound && creating => None,
            Err(error) => return Err(open_error(path, error)),
        };
        let kind = early_claim
            .as_ref()
            .map_or(DeviceKind::ImageFile, |(kind, _)| *kind);
        let file = Self::open_file(path, kind, options, creating)?;
        let meta = file.metadata().map_err(|error| open_error(path, error))?;
        let claim = match early_claim {
            Some((_, claim)) => claim,
            None => claim_or_busy(path, &meta, options.read_only)?,
        };
        if claim.key() != (meta.dev(), meta.ino()) || kind_of(path, &meta)? != kind {
            let changed = io::Error::other("the path changed while it was being opened");
            return Err(open_error(path, changed));
        }
        match kind {
            DeviceKind::ImageFile => Self::open_image(file, path, options, claim),
            DeviceKind::BlockDevice => Self::open_block(file, path, options, claim),
        }
    }

    fn check_options(options: &OpenOptions) -> Result<(), DeviceError> {
        if let Some(sector) = options.sector_size {
            check_geometry(0, sector)?;
        }
        if let Some(size) = options.create_size {
            let sector = options.sector_size.unwrap_or(IMAGE_SECTOR_SIZE_DEFAULT);
            check_geometry(size, sector)?;
        }
        Ok(())
    }

    fn open_file(
        path: &Path,
        kind: DeviceKind,
        options: &OpenOptions,
        creating: bool,
    ) -> Result<File, DeviceError> {
        let mut flags = 0;
        if options.direct {
            flags |= libc::O_DIRECT;
        }
        if kind == DeviceKind::BlockDevice {
            // Without O_CREAT, O_EXCL on a block device asks for an exclusive claim.
            flags |= libc::O_EXCL;
        }
        let mut open = fs::OpenOptions::new();
        open.read(true)
            .write(!options.read_only)
            .create(creating && kind == DeviceKind::ImageFile)
            .custom_flags(flags);
        open.open(path).map_err(|error| match error.raw_os_error() {
            Some(libc::EINVAL) if options.direct => DeviceError::DirectIoUnsupported {
                path: path.to_owned(),
            },
            Some(libc::EBUSY) if kind == DeviceKind::BlockDevice => {
                let rdev = fs::metadata(path).map_or(0, |meta| meta.rdev());
                busy(path, claim::describe_block_holder(rdev))
            }
            _ => open_error(path, error),
        })
    }

    fn open_image(
        file: File,
        path: &Path,
        options: &OpenOptions,
        claim: Claim,
    ) -> Result<FileDevice, DeviceError> {
        match claim::lock_image(&file, options.read_only) {
            Ok(()) => {}
            Err(LockError::Held(pid)) => return Err(busy(path, claim::describe_lock_holder(pid))),
            Err(LockError::Io(error)) => return Err(io_error("lock", 0, 0, error)),
        }
        let mut len = file
            .metadata()
            .map_err(|error| open_error(path, error))?
            .len();
        let grow_to = options
            .create_size
            .filter(|&size| size > len && !options.read_only);
        if let Some(create_size) = grow_to {
            // set_len only changes the size: the new range is a hole, so this is instant.
            file.set_len(create_size)
                .map_err(|error| io_error("extend", len, create_size - len, error))?;
            len = create_size;
        }
        let sector = options.sector_size.unwrap_or(IMAGE_SECTOR_SIZE_DEFAULT);
        Ok(FileDevice {
            file,
            path: path.to_owned(),
            kind: DeviceKind::ImageFile,
            // A trailing partial sector cannot be transferred, so it is not part of the device.
            size_bytes: (len - len % u64::from(sector)).into(),
            logical_sector_size: sector,
            physical_sector_size: IMAGE_PHYSICAL_SECTOR_SIZE.max(sector),
            read_only: options.read_only,
            direct: options.direct,
            _claim: claim,
            rings: RingPool::default(),
            reads: OnceLock::new(),
        })
    }

    fn open_block(
        file: File,
        path: &Path,
        options: &OpenOptions,
        claim: Claim,
    ) -> Result<FileDevice, DeviceError> {
        let ioctl_error = |op| move |error| io_error(op, 0, 0, error);
        let size_bytes = sys::block_size_bytes(&file).map_err(ioctl_error("BLKGETSIZE64"))?;
        let device_logical = sys::logical_sector_size(&file).map_err(ioctl_error("BLKSSZGET"))?;
        let physical = sys::physical_sector_size(&file).map_err(ioctl_error("BLKPBSZGET"))?;
        let logical = options.sector_size.unwrap_or(device_logical);
        if device_logical == 0 || !logical.is_multiple_of(device_logical) {
            return Err(DeviceError::Geometry {
                reason: format!(
                    "sector size {logical} is not a multiple of {}'s {device_logical}-byte sector",
                    path.display()
                ),
            });
        }
        check_geometry(0, logical)?;
        Ok(FileDevice {
            file,
            path: path.to_owned(),
            kind: DeviceKind::BlockDevice,
            size_bytes: (size_bytes - size_bytes % u64::from(logical)).into(),
            logical_sector_size: logical,
            physical_sector_size: physical.max(logical),
            read_only: options.read_only,
            direct: options.direct,
            _claim: claim,
            rings: RingPool::default(),
            reads: OnceLock::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// Whether I/O bypasses the page cache (`O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.direct
    }

    fn check_writable(&self, op: &'static str) -> Result<(), DeviceError> {
        if self.read_only {
            return Err(DeviceError::ReadOnly { op });
        }
        Ok(())
    }

    /// Whether every part of `job` may go to the kernel as it is: inside the device, in
    /// whole sectors, into memory aligned for `O_DIRECT`.
    fn direct_job(&self, job: &ReadJob) -> Result<bool, DeviceError> {
        let mut direct = self.direct;
        for (offset, range) in &job.parts {
            let len = range.len() as u64;
            check_transfer(*offset, len, self.logical_sector_size, self.size_bytes())?;
            if range.end > job.buf.len() || len > u64::from(u32::MAX) {
                return Err(DeviceError::OutOfRange {
                    offset: range.start as u64,
                    len,
                    size: job.buf.len() as u64,
                });
            }
            let address = job.buf.as_ptr() as usize + range.start;
            direct &= address.is_multiple_of(BUFFER_ALIGN);
        }
        Ok(direct)
    }

    /// Partial transfers may continue from any multiple of this (see `transfer_all`).
    fn resume_unit(&self) -> usize {
        if self.direct {
            self.logical_sector_size as usize
        } else {
            1
        }
    }
}

/// Runs `step` (one pread or pwrite into the buffer's remainder, given the bytes done and the
/// absolute offset) until `len` bytes moved. EINTR is retried; a partial transfer continues when
/// it ends on a multiple of `resume_unit` (the sector for `O_DIRECT`, whose kernel refuses
/// misaligned continuations; 1 for buffered I/O); a zero transfer or a misaligned partial one
/// ends with `ShortTransfer`.
fn transfer_all(
    op: &'static str,
    offset: u64,
    len: usize,
    resume_unit: usize,
    mut step: impl FnMut(usize, u64) -> io::Result<usize>,
) -> Result<(), DeviceError> {
    debug_assert!(resume_unit > 0);
    let mut done = 0usize;
    while done < len {
        match step(done, offset + done as u64) {
            Ok(0) => {}
            Ok(moved) => {
                done += moved;
                if done == len || done.is_multiple_of(resume_unit) {
                    continue;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(io_error(op, offset, len as u64, error)),
        }
        return Err(DeviceError::ShortTransfer {
            op,
            offset,
            len: len as u64,
            done: done as u64,
        });
    }
    debug_assert_eq!(done, len);
    Ok(())
}

impl BatchTarget for FileDevice {
    fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }

    fn write_one(&self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.write_from(offset, buf)
    }

    fn direct_ok(&self, buf: &[u8]) -> bool {
        (buf.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN)
    }

    fn may_resume_at(&self, done: usize) -> bool {
        done.is_multiple_of(self.resume_unit())
    }
}

impl Drop for FileDevice {
    /// The completion thread finishes its reads before the descriptor closes.
    fn drop(&mut self) {
        drop(self.reads.take());
    }
}

/// The open descriptor, for handing the device to the kernel (a loop device over it). Never
/// close a duplicate of it: closing any descriptor of an image drops this process's lock.
impl std::os::fd::AsFd for FileDevice {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.read_into(offset, buf)
    }

    /// Straight into `buf` when its address suits `O_DIRECT` (aligned to `BUFFER_ALIGN`),
    /// else through a bounce buffer.
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        if !(buf.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN) {
            return bounce_read(self, offset, buf);
        }
        let len = buf.len();
        check_transfer(
            offset,
            len as u64,
            self.logical_sector_size,
            self.size_bytes(),
        )?;
        let file = &self.file;
        transfer_all("read", offset, len, self.resume_unit(), |done, at| {
            file.read_at(&mut buf[done..], at)
        })
    }

    fn write_at(&self, offset: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.write_from(offset, buf)
    }

    /// Through the completion thread's io_uring when every part suits it; else (buffered
    /// I/O, unaligned memory, no io_uring) synchronously, as the default does.
    fn read_async(&self, job: ReadJob, done: ReadDone) {
        let engine = match self.direct_job(&job) {
            Err(error) => return done(job.buf, Err(error)),
            Ok(false) => None,
            Ok(true) => self
                .reads
                .get_or_init(|| {
                    let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
                    ReadEngine::start(fd, self.resume_unit())
                })
                .as_ref(),
        };
        match engine {
            Some(engine) => engine.submit(job, done),
            None => {
                let ReadJob { mut buf, parts } = job;
                let outcome = parts.iter().try_for_each(|(offset, range)| {
                    self.read_into(*offset, &mut buf[range.clone()])
                });
                done(buf, outcome);
            }
        }
    }

    /// Straight from `buf` when its address suits `O_DIRECT`, else through a copy.
    fn write_from(&self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        if !(buf.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN) {
            return self.write_at(offset, &AlignedBuf::from_slice(buf));
        }
        let len = buf.len();
        check_transfer(
            offset,
            len as u64,
            self.logical_sector_size,
            self.size_bytes(),
        )?;
        self.check_writable("write")?;
        let file = &self.file;
        transfer_all("write", offset, len, self.resume_unit(), |done, at| {
            file.write_at(&buf[done..], at)
        })
    }

    /// Through io_uring, up to 64 writes in flight (threads where io_uring is refused).
    fn write_batch(&self, writes: &[BatchWrite<'_>]) -> Result<(), DeviceError> {
        self.check_writable("write")?;
        for &(offset, buf) in writes {
            check_transfer(
                offset,
                buf.len() as u64,
                self.logical_sector_size,
                self.size_bytes(),
            )?;
        }
        crate::batch::write_batch(&self.rings, self, writes)
    }

    /// `fdatasync` for image files (the data and the size, not the timestamps), `fsync` for
    /// block devices (which also flushes the device's volatile cache). A no-op when read-only.
    fn flush(&self) -> Result<(), DeviceError> {
        if self.read_only {
            return Ok(());
        }
        loop {
            let result = match self.kind {
                DeviceKind::ImageFile => self.file.sync_data(),
                DeviceKind::BlockDevice => self.file.sync_all(),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(io_error("flush", 0, self.size_bytes(), error)),
            }
        }
    }

    /// Punches a hole (image files) or issues BLKDISCARD (block devices). `Ok(false)` when the
    /// filesystem or device does not support it.
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        check_transfer(offset, len, self.logical_sector_size, self.size_bytes())?;
        self.check_writable("discard")?;
        if len == 0 {
            return Ok(true);
        }
        let result = match self.kind {
            DeviceKind::ImageFile => sys::punch_hole(&self.file, offset, len),
            DeviceKind::BlockDevice => sys::block_discard(&self.file, offset, len),
        };
        match result {
            Ok(()) => Ok(true),
            Err(error) if sys::is_unsupported(&error) => Ok(false),
            Err(error) => Err(io_error("discard", offset, len, error)),
        }
    }

    /// Image files punch a hole (reads back zeros, frees the space, stays sparse); block
    /// devices use `BLKZEROOUT`. Either falls back to writing zeros where unsupported.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_transfer(offset, len, self.logical_sector_size, self.size_bytes())?;
        self.check_writable("write_zeroes")?;
        if len == 0 {
            return Ok(());
        }
        let result = match self.kind {
            DeviceKind::ImageFile => sys::punch_hole(&self.file, offset, len),
            DeviceKind::BlockDevice => sys::block_zero_out(&self.file, offset, len),
        };
        match result {
            Ok(()) => Ok(()),
            Err(error) if sys::is_unsupported(&error) => write_zero_buffers(self, offset, len),
            Err(error) => Err(io_error("write_zeroes", offset, len, error)),
        }
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Image files: extended (sparse) to `bytes` if shorter; block devices: the size read
    /// again (after `lvextend`, a resized nbd export). The size never shrinks.
    fn grow_to(&self, bytes: Option<u64>) -> Result<u64, DeviceError> {
        let sector = u64::from(self.logical_sector_size);
        let now = match self.kind {
            DeviceKind::ImageFile => {
                let len = self
                    .file
                    .metadata()
                    .map_err(|error| io_error("stat", 0, 0, error))?
                    .len();
                match bytes.filter(|&wanted| wanted > len) {
                    Some(wanted) => {
                        self.check_writable("extend")?;
                        self.file
                            .set_len(wanted)
                            .map_err(|error| io_error("extend", len, wanted - len, error))?;
                        wanted
                    }
                    None => len,
                }
            }
            DeviceKind::BlockDevice => sys::block_size_bytes(&self.file)
                .map_err(|error| io_error("BLKGETSIZE64", 0, 0, error))?,
        };
        let now = now - now % sector;
        let size = &self.size_bytes;
        Ok(size
            .fetch_max(now, std::sync::atomic::Ordering::AcqRel)
            .max(now))
    }

    fn logical_sector_size(&self) -> u32 {
        self.logical_sector_size
    }

    fn physical_sector_size(&self) -> u32 {
        self.physical_sector_size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that replays scripted results and records the offsets it was asked for.
    fn scripted(
        results: Vec<io::Result<usize>>,
        asked: &mut Vec<u64>,
    ) -> impl FnMut(usize, u64) -> io::Result<usize> + '_ {
        let mut results = results.into_iter();
        move |_, at| {
            asked.push(at);
            results.next().unwrap_or(Ok(0))
        }
    }

    // Checks that EINTR is retried and aligned partial transfers continue at the right offset.
    #[test]
    fn transfer_retries_eintr_and_continues_partials() {
        let mut asked = Vec::new();
        let eintr = || Err(io::Error::from_raw_os_error(libc::EINTR));
        let script = vec![eintr(), Ok(512), eintr(), Ok(1024), Ok(512)];
        transfer_all("read", 4096, 2048, 512, scripted(script, &mut asked)).unwrap();
        assert_eq!(asked, [4096, 4096, 4608, 4608, 5632]);
    }

    // Checks that zero and misaligned partial transfers are reported, and errors keep the range.
    #[test]
    fn transfer_reports_short_and_failed() {
        let mut asked = Vec::new();
        let result = transfer_all("write", 0, 2048, 512, scripted(vec![Ok(512)], &mut asked));
        let short = DeviceError::ShortTransfer {
            op: "write",
            offset: 0,
            len: 2048,
            done: 512,
        };
        assert_eq!(format!("{result:?}"), format!("{:?}", Err::<(), _>(short)));
        let result = transfer_all("read", 0, 2048, 512, scripted(vec![Ok(100)], &mut asked));
        assert!(matches!(
            result,
            Err(DeviceError::ShortTransfer { done: 100, .. })
        ));
        let script = vec![Ok(100), Ok(1948)];
        transfer_all("read", 0, 2048, 1, scripted(script, &mut asked)).unwrap();
        let failed = vec![Err(io::Error::from_raw_os_error(libc::EIO))];
        let result = transfer_all("read", 8192, 4096, 512, scripted(failed, &mut asked));
        let Err(DeviceError::Io {
            op,
            offset,
            len,
            source,
        }) = result
        else {
            panic!("expected an Io error, got {result:?}");
        };
        assert_eq!((op, offset, len), ("read", 8192, 4096));
        assert_eq!(source.raw_os_error(), Some(libc::EIO));
    }
}
