//! Inode flags (`chattr`) and the attributes `FS_IOC_FSSETXATTR` sets: reading and changing
//! them, what the immutable and append-only flags refuse, and what new inodes inherit.
//!
//! Kernel XFS is the reference for every rule, checked against an XFS loop mount
//! (`crates/fuse/tests/flags/`). An immutable inode takes no new writer, no truncate, no
//! attribute, xattr or name change, and an immutable directory no entry change; an
//! append-only inode takes writers that append, `touch`, and allocation, nothing that
//! rewrites or removes, and an append-only directory new entries but no removal. On XFS a
//! descriptor opened for writing before either flag was set keeps writing where it likes
//! (and may truncate an immutable file); so it does here.
//!
//! Through FUSE the kernel knows none of these flags, so every request that could break
//! them is checked here, writes from the kernel's writeback cache included. Writers opened
//! while a file is append-only get direct handles marked as such (`handle_is_guarded`):
//! their writes bypass the cache and must append (a write that rewrites bytes below the
//! end of file is refused unless the bytes are what is there). What the cache writes back
//! while a writer opened before the flag is still open is that writer's, which XFS lets
//! write anywhere; with none open, it must be an append too (a shared writable mapping of
//! an appending writer's file, which XFS refuses to make, cannot rewrite the file). A
//! library caller's write without a handle counts as one through a handle opened now.

use cairn_format::inode::{
    FileType, INODE_FLAG_APPEND, INODE_FLAG_COWEXTSIZE, INODE_FLAG_EXTSIZE_INHERIT,
    INODE_FLAG_IMMUTABLE, INODE_FLAG_NOATIME, INODE_FLAG_NODUMP, INODE_FLAG_PROJECT_INHERIT,
    INODE_FLAG_SYNC, InodeCore, extent_size_hint_max,
};
use cairn_journal::Reservation;

use crate::fs::Filesystem;
use crate::inode::{InodeData, now, timestamp};
use crate::types::{
    Credentials, FallocateMode, FileAttributes, FileAttributesReport, InodeFlags, OpenMode,
    SetAttr, TimeOrNow, WriteOrigin,
};
use crate::{FsError, perm};

/// Flags a new inode takes from its directory (XFS's `inherit_sync`, `inherit_noatime` and
/// `inherit_nodump`, all on by default).
const INHERITED_FLAGS: u32 = INODE_FLAG_SYNC | INODE_FLAG_NOATIME | INODE_FLAG_NODUMP;

/// The flag bits `set_file_attributes` sets; the others (REFLINK, which says the file may
/// share blocks, and bits a newer cairn may know) stay as they are.
const SET_BY_ATTRIBUTES: u32 = INODE_FLAG_IMMUTABLE
    | INODE_FLAG_APPEND
    | INODE_FLAG_SYNC
    | INODE_FLAG_NOATIME
    | INODE_FLAG_NODUMP
    | INODE_FLAG_PROJECT_INHERIT
    | INODE_FLAG_EXTSIZE_INHERIT
    | INODE_FLAG_COWEXTSIZE;

/// How far (seconds) an explicit modification time may be from now and still count as
/// `touch` (which the writeback cache sends as an explicit time).
const TOUCH_SLACK_SECONDS: i64 = 1;

/// The user flags in an inode's flag bits.
pub(crate) fn inode_flags(bits: u32) -> InodeFlags {
    InodeFlags {
        immutable: bits & INODE_FLAG_IMMUTABLE != 0,
        append_only: bits & INODE_FLAG_APPEND != 0,
        sync: bits & INODE_FLAG_SYNC != 0,
        no_atime: bits & INODE_FLAG_NOATIME != 0,
        no_dump: bits & INODE_FLAG_NODUMP != 0,
        project_inherit: bits & INODE_FLAG_PROJECT_INHERIT != 0,
    }
}

/// The flag bits of `flags` an inode of type `file_type` keeps (project inheritance only on
/// a directory, as XFS drops it silently elsewhere).
fn flag_bits(flags: &InodeFlags, file_type: Option<FileType>) -> u32 {
    let mut bits = 0;
    for (set, bit) in [
        (flags.immutable, INODE_FLAG_IMMUTABLE),
        (flags.append_only, INODE_FLAG_APPEND),
        (flags.sync, INODE_FLAG_SYNC),
        (flags.no_atime, INODE_FLAG_NOATIME),
        (flags.no_dump, INODE_FLAG_NODUMP),
        (flags.project_inherit, INODE_FLAG_PROJECT_INHERIT),
    ] {
        if set {
            bits |= bit;
        }
    }
    if file_type != Some(FileType::Directory) {
        bits &= !INODE_FLAG_PROJECT_INHERIT;
    }
    bits
}

fn is_immutable(data: &InodeData) -> bool {
    data.core.flags & INODE_FLAG_IMMUTABLE != 0
}

fn is_append_only(data: &InodeData) -> bool {
    data.core.flags & INODE_FLAG_APPEND != 0
}

/// Whether reads of the inode leave its access time alone (`A`).
pub(crate) fn keeps_atime(data: &InodeData) -> bool {
    data.core.flags & INODE_FLAG_NOATIME != 0
}

/// An open of `data` as `mode`: an immutable inode takes no writer and no truncate, an
/// append-only one only writers that append.
pub(crate) fn check_open(data: &InodeData, mode: &OpenMode) -> Result<(), FsError> {
    let refused = match () {
        _ if is_immutable(data) => mode.write || mode.truncate,
        _ if is_append_only(data) => (mode.write && !mode.append) || mode.truncate,
        _ => false,
    };
    match refused {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// A setattr of an immutable or append-only inode. Refused: owner and mode changes, and a
/// truncate, except (immutable) through a descriptor opened for writing before the flag;
/// explicit access times; on an immutable inode any time but those the kernel stamps for
/// such a descriptor's writes (modification and change time through a writable handle).
/// An append-only inode also takes `touch` (times set to now) and ctime alone.
pub(crate) fn check_setattr(data: &InodeData, changes: &SetAttr) -> Result<(), FsError> {
    let (immutable, append_only) = (is_immutable(data), is_append_only(data));
    if !immutable && !append_only {
        return Ok(());
    }
    let through_writer = changes.file.is_some_and(crate::attr::handle_is_writable);
    let owner_or_mode = changes.mode.is_some() || changes.uid.is_some() || changes.gid.is_some();
    let size_refused = changes.size.is_some() && (append_only || !through_writer);
    let times_allowed = match (changes.atime, changes.mtime) {
        (Some(TimeOrNow::Time(_)), _) => false,
        (Some(TimeOrNow::Now), _) => !immutable,
        (None, None) => true,
        (None, Some(TimeOrNow::Now)) => !immutable,
        (None, Some(TimeOrNow::Time(time))) => through_writer || (!immutable && is_about_now(time)),
    };
    match owner_or_mode || size_refused || !times_allowed {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// Whether `time` is within `TOUCH_SLACK_SECONDS` of now.
fn is_about_now(time: std::time::SystemTime) -> bool {
    let (then, now) = (timestamp(time).seconds, now().seconds);
    then.abs_diff(now) <= TOUCH_SLACK_SECONDS as u64
}

/// A change of the inode's extended attributes (ACLs included).
pub(crate) fn check_xattr_change(data: &InodeData) -> Result<(), FsError> {
    match is_immutable(data) || is_append_only(data) {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// A new entry in, or any change of the entries of, directory `data`.
pub(crate) fn check_entry_change(data: &InodeData) -> Result<(), FsError> {
    match is_immutable(data) {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// Removing the entry of `victim` from directory `dir` (unlink, rmdir, either name of a
/// rename): not from an append-only directory, not of an immutable or append-only inode.
/// Then the sticky-bit rule, as Linux's `may_delete` orders them.
pub(crate) fn may_delete(
    dir: &InodeData,
    victim: &InodeData,
    who: &Credentials,
) -> Result<(), FsError> {
    if is_append_only(dir) || is_immutable(victim) || is_append_only(victim) {
        return Err(FsError::NotPermitted);
    }
    perm::check_sticky(dir, victim, who)
}

/// A new hard link to `data`.
pub(crate) fn check_link(data: &InodeData) -> Result<(), FsError> {
    match is_immutable(data) || is_append_only(data) {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// A fallocate of `data`: nothing on an immutable inode; on an append-only one allocation
/// only (which may grow the file), no punching or zeroing.
pub(crate) fn check_fallocate(data: &InodeData, mode: FallocateMode) -> Result<(), FsError> {
    let allocate = matches!(mode, FallocateMode::Allocate { .. });
    match is_immutable(data) || (is_append_only(data) && !allocate) {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// The flags, extent size hint and project id a new inode of `child_type` takes from its
/// directory `parent`: sync, no-atime and no-dump; the hint when the directory passes it
/// on (a new directory passes it on too); the project id when the directory has project
/// inheritance (a new directory inherits that flag too); the CoW extent size hint when the
/// directory passes it on (COWEXTSIZE, which a new directory takes too).
pub(crate) fn inherit(parent: &InodeCore, child: &mut InodeCore, child_type: FileType) {
    let is_dir = child_type == FileType::Directory;
    child.flags = parent.flags & INHERITED_FLAGS;
    child.extent_size_hint = 0;
    child.project_id = 0;
    if parent.flags & INODE_FLAG_EXTSIZE_INHERIT != 0 {
        match child_type {
            FileType::Regular => child.extent_size_hint = parent.extent_size_hint,
            FileType::Directory => {
                child.extent_size_hint = parent.extent_size_hint;
                child.flags |= INODE_FLAG_EXTSIZE_INHERIT;
            }
            _ => {}
        }
    }
    if parent.flags & INODE_FLAG_PROJECT_INHERIT != 0 {
        child.project_id = parent.project_id;
        if is_dir {
            child.flags |= INODE_FLAG_PROJECT_INHERIT;
        }
    }
    child.cow_extent_size_hint = 0;
    if parent.flags & INODE_FLAG_COWEXTSIZE != 0 {
        match child_type {
            FileType::Regular => child.cow_extent_size_hint = parent.cow_extent_size_hint,
            FileType::Directory => {
                child.cow_extent_size_hint = parent.cow_extent_size_hint;
                child.flags |= INODE_FLAG_COWEXTSIZE;
            }
            _ => {}
        }
    }
}

impl Filesystem {
    /// The flags, extent size hint and project id of `inode`, with its extent count.
    pub fn file_attributes(&self, inode: u64) -> Result<FileAttributesReport, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        let block_size = u64::from(self.geometry.block_size);
        Ok(FileAttributesReport {
            attributes: FileAttributes {
                flags: inode_flags(data.core.flags),
                extent_size_hint: u64::from(data.core.extent_size_hint) * block_size,
                project_id: data.core.project_id,
                cow_extent_size_hint: u64::from(data.core.cow_extent_size_hint) * block_size,
            },
            extent_count: data.core.data_extent_count,
            has_xattrs: data.core.attr_format.is_some(),
        })
    }

    /// Sets the flags, extent size hint and project id of `inode` to `new`, as `who`, who
    /// must own it or be root; changing the immutable or append-only flag also needs
    /// `may_change_immutable` (CAP_LINUX_IMMUTABLE). The hint must be a multiple of the
    /// block size and at most half an AG, on a regular file or a directory (which passes
    /// it on), and a regular file's hint cannot change once it has data. The CoW extent size
    /// hint has the same limits, needs the reflink feature, and may change while a file has
    /// data (a directory's is passed on, with COWEXTSIZE). Updates ctime.
    pub fn set_file_attributes(
        &self,
        inode: u64,
        new: &FileAttributes,
        who: &Credentials,
        may_change_immutable: bool,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        let handle = self.live_inode(inode)?;
        let mut data = handle.data.lock();
        if who.uid != 0 && who.uid != data.core.uid {
            return Err(FsError::NotPermitted);
        }
        let old = inode_flags(data.core.flags);
        let protective_change =
            old.immutable != new.flags.immutable || old.append_only != new.flags.append_only;
        if protective_change && !may_change_immutable {
            return Err(FsError::NotPermitted);
        }
        let hint = self.hint_blocks(&data, new.extent_size_hint)?;
        let cow_hint = self.cow_hint_blocks(&data, new.cow_extent_size_hint)?;
        let file_type = data.file_type();
        let mut bits = flag_bits(&new.flags, file_type);
        if file_type == Some(FileType::Directory) && hint != 0 {
            bits |= INODE_FLAG_EXTSIZE_INHERIT;
        }
        if file_type == Some(FileType::Directory) && cow_hint != 0 {
            bits |= INODE_FLAG_COWEXTSIZE;
        }
        let core = &mut data.core;
        core.flags = bits | (core.flags & !SET_BY_ATTRIBUTES);
        core.extent_size_hint = hint;
        core.cow_extent_size_hint = cow_hint;
        core.project_id = new.project_id;
        core.ctime = now();
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        Self::log_inode(&mut tx, inode, &mut data);
        self.commit(tx, &mut [&mut data])?;
        Ok(())
    }

    /// The extent size hint in blocks for `hint_bytes` on the inode `data`, if allowed.
    fn hint_blocks(&self, data: &InodeData, hint_bytes: u64) -> Result<u32, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        if !hint_bytes.is_multiple_of(block_size) {
            return Err(FsError::InvalidArgument(
                "extent size hint not a multiple of the block size",
            ));
        }
        let hint_max = extent_size_hint_max(self.geometry.ag_blocks);
        let blocks = u32::try_from(hint_bytes / block_size)
            .ok()
            .filter(|&blocks| blocks <= hint_max)
            .ok_or(FsError::InvalidArgument(
                "extent size hint larger than half an allocation group",
            ))?;
        match data.file_type() {
            _ if blocks == data.core.extent_size_hint => Ok(blocks),
            Some(FileType::Regular) if has_data(data) => Err(FsError::InvalidArgument(
                "the extent size hint of a file with data cannot change",
            )),
            Some(FileType::Regular | FileType::Directory) => Ok(blocks),
            _ if blocks == 0 => Ok(0),
            _ => Err(FsError::InvalidArgument(
                "an extent size hint needs a regular file or a directory",
            )),
        }
    }

    /// The CoW extent size hint in blocks for `hint_bytes` on the inode `data`, if allowed:
    /// whole blocks, at most half an AG, on a regular file or a directory, and only on a
    /// filesystem with the reflink feature. Unlike the extent size hint it may change while
    /// the file has data (as on XFS): it shapes only later copies.
    fn cow_hint_blocks(&self, data: &InodeData, hint_bytes: u64) -> Result<u32, FsError> {
        if hint_bytes == u64::from(data.core.cow_extent_size_hint) * self.block_bytes() {
            return Ok(data.core.cow_extent_size_hint);
        }
        if hint_bytes == 0 {
            return Ok(0);
        }
        if !self.superblock.has_reflink() {
            return Err(FsError::InvalidArgument(
                "a CoW extent size hint needs the reflink feature",
            ));
        }
        let block_size = self.block_bytes();
        if !hint_bytes.is_multiple_of(block_size) {
            return Err(FsError::InvalidArgument(
                "CoW extent size hint not a multiple of the block size",
            ));
        }
        let hint_max = extent_size_hint_max(self.geometry.ag_blocks);
        let blocks = u32::try_from(hint_bytes / block_size)
            .ok()
            .filter(|&blocks| blocks <= hint_max)
            .ok_or(FsError::InvalidArgument(
                "CoW extent size hint larger than half an allocation group",
            ))?;
        match data.file_type() {
            Some(FileType::Regular | FileType::Directory) => Ok(blocks),
            _ => Err(FsError::InvalidArgument(
                "a CoW extent size hint needs a regular file or a directory",
            )),
        }
    }

    fn block_bytes(&self) -> u64 {
        u64::from(self.geometry.block_size)
    }

    /// Sets inode `inode`'s extent size hint (bytes; 0 clears it), keeping its other
    /// attributes: on a directory the hint is what new files inherit, so `inherit` must
    /// be true for a nonzero one there (as XFS's EXTSZINHERIT). As root.
    pub fn set_extent_size_hint(
        &self,
        inode: u64,
        hint_bytes: u64,
        inherit: bool,
    ) -> Result<(), FsError> {
        let refusal = "a directory's extent size hint is only for inheriting";
        self.set_hint(inode, (hint_bytes, inherit), refusal, |attributes| {
            attributes.extent_size_hint = hint_bytes;
        })
    }

    /// Sets one hint of `inode` with `set`, as root, keeping its other attributes: a nonzero
    /// one on a directory only with `inherit` (else `refusal`).
    pub(crate) fn set_hint(
        &self,
        inode: u64,
        (hint_bytes, inherit): (u64, bool),
        refusal: &'static str,
        set: impl FnOnce(&mut FileAttributes),
    ) -> Result<(), FsError> {
        let mut attributes = self.file_attributes(inode)?.attributes;
        if !inherit && hint_bytes != 0 && self.getattr(inode)?.kind == crate::FileKind::Directory {
            return Err(FsError::InvalidArgument(refusal));
        }
        set(&mut attributes);
        self.set_file_attributes(inode, &attributes, &Credentials::root(), true)
    }

    /// Writes `data` at `offset` of `inode` as `origin` says it came (`write`, but with the
    /// inode flags' rules applied to what the FUSE layer knows of the write; see
    /// `WriteOrigin`).
    pub fn write_from(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        origin: &WriteOrigin<'_>,
    ) -> Result<u32, FsError> {
        let direct = origin.handle.is_some_and(crate::attr::handle_is_direct);
        self.write_checked(inode, offset, data, origin, direct)
    }

    /// A write with the flags' rules. An immutable file takes writes only through handles
    /// opened before the flag (or their cached data). An append-only file takes bytes below
    /// its end of file from such handles too, else only when they equal what is there
    /// (a cache's whole first page of an append). A sync-flagged file's write is durable,
    /// data and what reads it back, when this returns.
    pub(crate) fn write_checked(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        origin: &WriteOrigin<'_>,
        direct: bool,
    ) -> Result<u32, FsError> {
        let (flags, size, unguarded_writers) = {
            let handle = self.live_inode(inode)?;
            let meta = handle.data.lock();
            (meta.core.flags, meta.core.size, meta.unguarded_writers)
        };
        // The cache's data names a guessed handle: it can only come from a writer opened
        // before the flag if one is still open (the kernel writes a descriptor's pages back
        // before it releases it).
        let earlier = match origin.from_cache {
            true => unguarded_writers > 0,
            false => origin
                .handle
                .is_some_and(|h| !crate::attr::handle_is_guarded(h)),
        };
        let immutable = flags & INODE_FLAG_IMMUTABLE != 0;
        if immutable && origin.handle.is_none() && !origin.from_cache {
            return Err(FsError::NotPermitted);
        }
        if flags & INODE_FLAG_APPEND != 0 && !earlier && offset < size && !data.is_empty() {
            let overlap = (size - offset).min(data.len() as u64) as u32;
            let current = self.read_unaccessed(inode, offset, overlap)?;
            if *current != data[..overlap as usize] {
                return Err(FsError::NotPermitted);
            }
        }
        let writer = origin.clears_set_id;
        let written = self.write_as(inode, offset, data, writer, direct)?;
        if flags & INODE_FLAG_SYNC != 0 {
            self.fsync(inode, true)?;
        }
        Ok(written)
    }
}

/// A `copy_file_range` into `data` from byte `offset` on, ruled as a write without a handle
/// (`write_checked`): an immutable file takes none, an append-only one only past its end.
pub(crate) fn check_copy_into(data: &InodeData, offset: u64) -> Result<(), FsError> {
    let rewrites = offset < data.core.size;
    match is_immutable(data) || (is_append_only(data) && rewrites) {
        true => Err(FsError::NotPermitted),
        false => Ok(()),
    }
}

/// Whether a regular file holds data (mapped, cached or within its size).
fn has_data(data: &InodeData) -> bool {
    data.core.data_extent_count > 0 || data.core.size > 0 || data.delayed_blocks > 0
}

/// Whether writers of `data` get direct handles: a sync-flagged file's writes are made
/// durable as they come, and an append-only file's checked as they come, so neither may
/// wait in the kernel's cache.
pub(crate) fn writes_through(data: &InodeData) -> bool {
    data.core.flags & (INODE_FLAG_SYNC | INODE_FLAG_APPEND) != 0
}

/// Whether writers opened now must append (the file is append-only).
pub(crate) fn guards_writers(data: &InodeData) -> bool {
    is_append_only(data)
}
