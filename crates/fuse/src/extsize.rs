//! `cairn extsize PATH... [--set SIZE]`: reads or sets the extent size hint of files and
//! directories through `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`, the ioctls `xfs_io -c
//! extsize` uses (it refuses filesystems other than XFS). A regular file's hint is its own
//! (`FS_XFLAG_EXTSIZE`); a directory's is passed on to the files and directories made in
//! it (`FS_XFLAG_EXTSZINHERIT`). Works on any filesystem that takes those ioctls. With
//! `--cow` it reads or sets the copy-on-write extent size hint instead (`fsx_cowextsize`
//! with `FS_XFLAG_COWEXTSIZE`, as `xfs_io -c cowextsize`): the unit a write into shared
//! blocks copies, a directory's passed on too.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::fileattr::{
    FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FSXATTR_BYTES, Fsxattr, XFLAG_COWEXTSIZE, XFLAG_EXTSIZE,
    XFLAG_EXTSZINHERIT,
};

/// Prints the hint (`cow`: the CoW extent size hint) of each of `paths`, or sets it to
/// `set` bytes (0 clears it) first.
pub fn run(paths: &[std::path::PathBuf], set: Option<u64>, cow: bool) -> Result<(), String> {
    for path in paths {
        let shown =
            show_or_set(path, set, cow).map_err(|error| describe(path, &error, set, cow))?;
        println!("{shown}");
    }
    Ok(())
}

/// The line printed for `path` (after setting its hint to `set`, if given).
fn show_or_set(path: &Path, set: Option<u64>, cow: bool) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let directory = file.metadata()?.is_dir();
    let mut attr = get(&file)?;
    if let Some(bytes) = set {
        let bytes =
            u32::try_from(bytes).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let (flags, flag) = match (cow, directory) {
            (true, _) => (XFLAG_COWEXTSIZE, XFLAG_COWEXTSIZE),
            (false, true) => (XFLAG_EXTSIZE | XFLAG_EXTSZINHERIT, XFLAG_EXTSZINHERIT),
            (false, false) => (XFLAG_EXTSIZE | XFLAG_EXTSZINHERIT, XFLAG_EXTSIZE),
        };
        attr.xflags &= !flags;
        if bytes != 0 {
            attr.xflags |= flag;
        }
        match cow {
            true => attr.cowextsize = bytes,
            false => attr.extsize = bytes,
        }
        put(&file, &attr)?;
        attr = get(&file)?;
    }
    let (name, hint) = match cow {
        true => ("CoW extent size hint", u64::from(attr.cowextsize)),
        false => ("extent size hint", u64::from(attr.extsize)),
    };
    let passed_on = match directory && hint != 0 {
        true => ", passed on to new files",
        false => "",
    };
    Ok(format!(
        "{}: {name} {hint} bytes ({}){passed_on}",
        path.display(),
        crate::cli::human_bytes(hint)
    ))
}

fn describe(path: &Path, error: &std::io::Error, set: Option<u64>, cow: bool) -> String {
    let why = match error.raw_os_error() {
        Some(libc::ENOTTY | libc::EOPNOTSUPP) => " (the filesystem has no extent size hints)",
        Some(libc::EINVAL) if set.is_some() && cow => {
            " (a CoW hint must be a multiple of the block size and at most half an \
             allocation group, on a filesystem with shared extents (reflink))"
        }
        Some(libc::EINVAL) if set.is_some() => {
            " (a hint must be a multiple of the block size and at most half an allocation \
             group, and a file's hint cannot change once it has data)"
        }
        Some(libc::EPERM) => " (only the owner or root may set a hint)",
        _ => "",
    };
    format!("{}: {error}{why}", path.display())
}

fn get(file: &std::fs::File) -> std::io::Result<Fsxattr> {
    let mut raw = [0u8; FSXATTR_BYTES];
    ioctl(file, FS_IOC_FSGETXATTR, &mut raw)?;
    Fsxattr::decode(&raw).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EIO))
}

fn put(file: &std::fs::File, attr: &Fsxattr) -> std::io::Result<()> {
    let mut raw = attr.encode();
    ioctl(file, FS_IOC_FSSETXATTR, &mut raw)
}

fn ioctl(file: &std::fs::File, request: u32, raw: &mut [u8; FSXATTR_BYTES]) -> std::io::Result<()> {
    // SAFETY: both requests read or write exactly one `struct fsxattr`, which `raw` holds.
    let done = unsafe { libc::ioctl(file.as_raw_fd(), request.into(), raw.as_mut_ptr()) };
    match done {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
