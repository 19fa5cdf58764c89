//! Exclusive access to an image file or block device: the in-process registry, the POSIX record
//! lock on image files, and naming whoever holds a busy device.
//!
//! POSIX `fcntl` locks belong to a process, so a second open in the same process would not
//! conflict with the first; the registry closes that gap. It is also consulted *before* a file
//! is opened, because closing any descriptor of a file drops every POSIX lock the process holds
//! on it: a refused second open must never get as far as opening (and closing) the file.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use parking_lot::Mutex;

/// How one file is held inside this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    /// One read-write open.
    Exclusive,
    /// This many read-only opens.
    Shared(usize),
}

/// Files opened by this process, keyed by (device, inode).
static OPEN_FILES: Mutex<BTreeMap<(u64, u64), Share>> = Mutex::new(BTreeMap::new());

/// A registry entry, released on drop.
#[derive(Debug)]
pub(crate) struct Claim {
    key: (u64, u64),
}

impl Claim {
    /// Registers (device, inode) `key`; `None` when it conflicts with an open in this process
    /// (any read-write open conflicts; read-only opens share).
    pub(crate) fn acquire(key: (u64, u64), read_only: bool) -> Option<Claim> {
        let mut open_files = OPEN_FILES.lock();
        let next = match (open_files.get(&key), read_only) {
            (None, false) => Share::Exclusive,
            (None, true) => Share::Shared(1),
            (Some(Share::Shared(count)), true) => Share::Shared(count + 1),
            (Some(_), _) => return None,
        };
        open_files.insert(key, next);
        Some(Claim { key })
    }

    pub(crate) fn key(&self) -> (u64, u64) {
        self.key
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut open_files = OPEN_FILES.lock();
        match open_files.get(&self.key).copied() {
            Some(Share::Shared(count)) if count > 1 => {
                open_files.insert(self.key, Share::Shared(count - 1));
            }
            _ => {
                open_files.remove(&self.key);
            }
        }
    }
}

/// Outcome of trying to lock an image file.
#[derive(Debug)]
pub(crate) enum LockError {
    /// Another process holds a conflicting lock; its pid when the kernel could tell.
    Held(Option<u32>),
    Io(io::Error),
}

fn whole_file_lock(lock_type: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers, for which all-zero bytes are valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    // The lock constants are tiny (0..=2), so the narrowing casts are exact.
    lock.l_type = lock_type as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    // A length of zero covers the whole file, however far it grows.
    lock.l_len = 0;
    lock
}

/// Takes a POSIX record lock on all of `file`: shared for read-only opens, exclusive otherwise.
/// The lock lives until the process closes its last descriptor of the file.
pub(crate) fn lock_image(file: &File, read_only: bool) -> Result<(), LockError> {
    let lock_type = if read_only {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    let lock = whole_file_lock(lock_type);
    loop {
        // SAFETY: `file` is an open descriptor and `lock` a valid `flock` that outlives the call.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EACCES | libc::EAGAIN) => {
                return Err(LockError::Held(lock_holder(file, lock_type)));
            }
            _ => return Err(LockError::Io(error)),
        }
    }
}

/// The pid of a process holding a lock that conflicts with `lock_type`, if any.
fn lock_holder(file: &File, lock_type: libc::c_int) -> Option<u32> {
    let mut probe = whole_file_lock(lock_type);
    // SAFETY: as in `lock_image`; F_GETLK writes the conflicting lock back into `probe`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut probe) };
    let unlocked = libc::F_UNLCK as libc::c_short;
    if rc != 0 || probe.l_type == unlocked {
        return None;
    }
    u32::try_from(probe.l_pid).ok().filter(|&pid| pid > 0)
}

/// "pid N (comm)", or "pid N" when the process name cannot be read.
pub(crate) fn describe_pid(pid: u32) -> String {
    match fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => format!("pid {pid} ({})", comm.trim_end()),
        Err(_) => format!("pid {pid}"),
    }
}

/// The holder text for a busy image file.
pub(crate) fn describe_lock_holder(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("locked by {}", describe_pid(pid)),
        None => "locked by another process".to_owned(),
    }
}

/// Processes with a descriptor open on the block device `rdev`, found by scanning /proc.
pub(crate) fn block_device_holders(rdev: u64) -> Vec<u32> {
    let Ok(processes) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut holders = Vec::new();
    for entry in processes.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if process_holds(pid, rdev) {
            holders.push(pid);
        }
    }
    holders
}

fn process_holds(pid: u32, rdev: u64) -> bool {
    let Ok(descriptors) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    descriptors.flatten().any(|descriptor| {
        // Only descriptors naming a device node are worth a stat of their target.
        let names_device =
            fs::read_link(descriptor.path()).is_ok_and(|target| target.starts_with("/dev/"));
        names_device
            && fs::metadata(descriptor.path())
                .is_ok_and(|meta| meta.file_type().is_block_device() && meta.rdev() == rdev)
    })
}

/// The holder text for a block device refused with EBUSY.
pub(crate) fn describe_block_holder(rdev: u64) -> String {
    let holders = block_device_holders(rdev);
    if holders.is_empty() {
        return "mounted or opened exclusively by another program".to_owned();
    }
    let names: Vec<String> = holders.into_iter().map(describe_pid).collect();
    format!("held open by {}", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that writers exclude everyone, readers share, and drop releases the entry.
    #[test]
    fn registry_sharing_rules() {
        let key = (u64::MAX, u64::MAX - 7);
        let reader = Claim::acquire(key, true).unwrap();
        let second_reader = Claim::acquire(key, true).unwrap();
        assert!(Claim::acquire(key, false).is_none());
        drop(reader);
        assert!(Claim::acquire(key, false).is_none());
        drop(second_reader);
        let writer = Claim::acquire(key, false).unwrap();
        assert_eq!(writer.key(), key);
        assert!(Claim::acquire(key, true).is_none());
        drop(writer);
        assert!(Claim::acquire(key, true).is_some());
    }

    // Checks the holder descriptions for our own pid and for an unknown holder.
    #[test]
    fn holder_descriptions() {
        let own = std::process::id();
        assert!(describe_pid(own).starts_with(&format!("pid {own} (")));
        assert_eq!(describe_lock_holder(None), "locked by another process");
        assert!(describe_lock_holder(Some(own)).contains(&format!("pid {own}")));
        // No process holds a device number that does not exist.
        assert!(describe_block_holder(u64::MAX).contains("mounted or opened exclusively"));
    }
}
