//! The mount's backing device info (bdi): its readahead window and its share of the
//! kernel's dirty page limit. FUSE gives every mount a bdi of its own, with settings meant
//! for a daemon the kernel cannot trust; root may change them in sysfs once the handshake is
//! done, at `/sys/class/bdi/MAJ:MIN[-fuseblk]/` (FUSE names the bdi after the superblock's
//! device number, with "-fuseblk" on `fuseblk` mounts).
//!
//! - **Readahead** (`read_ahead_kb`): the kernel's default is 128 KiB, and the
//!   `max_readahead` of the handshake can only lower it: so buffered sequential reads reach
//!   the daemon as 128 KiB requests, one device read each, while XFS on a loop device reads
//!   ahead 2.5 MiB (the loop device's own window). The handshake's reply lowers it to
//!   `max_readahead`, so it is set after.
//! - **Dirty share** (`max_ratio`): a FUSE bdi may hold 1% of the kernel's dirty page limit
//!   (`strict_limit`: enforced even when the system is far below its limit), so a daemon
//!   that hangs pins little memory. Random buffered writes then wait for the daemon's
//!   writeback after 50 MB here, where XFS caches up to the system's limit: 4 KiB random
//!   writes ran at 52 thousand a second against XFS's 195 thousand, and at 205 thousand
//!   with a 10% share. A larger share buys little more for them and delays the background
//!   writeback of a sequential stream until its end (its threshold scales with the share):
//!   1 GiB written then `fsync`ed ran at 0.84x with 50%, 1.10x with 10%. The strict limit
//!   stays, so a mount never takes more than its share and other writers keep the rest.
//!   The daemon's own device I/O bypasses the page cache (`O_DIRECT`), so its writeback
//!   never waits on the dirty pages it is cleaning; with `-o buffered` it would, so the
//!   kernel's 1% stays there.

use std::io;
use std::path::{Path, PathBuf};

/// The sysfs directory of the FUSE mount's bdi.
#[derive(Debug)]
pub struct Bdi {
    directory: PathBuf,
}

impl Bdi {
    /// The bdi of the mount at `mountpoint`, its device number read from
    /// `/proc/self/mountinfo`: a `stat` of the mountpoint would wait for this daemon, which
    /// is not serving yet.
    pub fn of_mount(mountpoint: &Path) -> io::Result<Bdi> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let device = device_of(&mountinfo, mountpoint).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "mount not in /proc/self/mountinfo")
        })?;
        bdi_directory(&device).map(|directory| Bdi { directory })
    }

    /// Sets the readahead window to `bytes` (rounded down to KiB).
    pub fn set_readahead(&self, bytes: u64) -> io::Result<()> {
        std::fs::write(
            self.directory.join("read_ahead_kb"),
            format!("{}\n", bytes / 1024),
        )
    }

    /// Sets the share of the kernel's dirty page limit the mount may hold, in percent.
    pub fn set_dirty_ratio(&self, percent: u8) -> io::Result<()> {
        std::fs::write(self.directory.join("max_ratio"), format!("{percent}\n"))
    }
}

/// The `MAJ:MIN` of the newest mount at `mountpoint` in a mountinfo text.
fn device_of(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    let wanted = mountpoint.to_str()?;
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (device, point) = (fields.get(2)?, fields.get(4)?);
            (unescape(point) == wanted).then(|| (*device).to_string())
        })
        .next_back()
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo` (octal).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let octal = bytes.get(at + 1..at + 4).filter(|digits| {
            bytes[at] == b'\\' && digits.iter().all(|digit| (b'0'..=b'7').contains(digit))
        });
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |value, digit| value * 8 + u32::from(digit - b'0'));
                out.push(value as u8);
                at += 4;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of the FUSE bdi of device `MAJ:MIN`: the `-fuseblk` one where it exists
/// (the plain `MAJ:MIN` bdi is then the loop device's own).
fn bdi_directory(device: &str) -> io::Result<PathBuf> {
    ["-fuseblk", ""]
        .iter()
        .map(|suffix| PathBuf::from(format!("/sys/class/bdi/{device}{suffix}")))
        .find(|path| path.exists())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no bdi for {device}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
80 22 0:52 / /mnt/a\\040b rw,nosuid,nodev shared:40 - fuse.cairn img rw,user_id=0
81 22 7:3 / /mnt/c rw,nosuid,nodev shared:41 - fuseblk.cairn /dev/loop3 rw
82 22 7:4 / /mnt/c rw,nosuid,nodev shared:42 - fuseblk.cairn /dev/loop4 rw
";

    #[test]
    fn finds_the_newest_mount_at_a_path_with_escapes() {
        assert_eq!(
            device_of(MOUNTINFO, Path::new("/mnt/a b")).as_deref(),
            Some("0:52")
        );
        assert_eq!(
            device_of(MOUNTINFO, Path::new("/mnt/c")).as_deref(),
            Some("7:4")
        );
        assert_eq!(device_of(MOUNTINFO, Path::new("/mnt")), None);
    }

    #[test]
    fn unescapes_octal_and_keeps_other_backslashes() {
        assert_eq!(unescape("a\\011b\\134c\\9"), "a\tb\\c\\9");
    }
}
