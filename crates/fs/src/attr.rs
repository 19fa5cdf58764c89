//! Attribute changes (chmod, chown, truncate, times) and open/release.

use cairn_journal::Reservation;

use crate::fs::Filesystem;
use crate::inode::{Inode, InodeData, now, timestamp};
use crate::types::{AtimeMode, Attr, Credentials, OpenFile, OpenMode, SetAttr, TimeOrNow};
use crate::{FsError, flags, perm};

/// How old an access time may get before relatime updates it anyway (a day, as Linux).
const RELATIME_SECONDS: i64 = 24 * 60 * 60;

impl Filesystem {
    /// Applies `changes` made by `who`; a size change truncates. Clears setuid/setgid where
    /// Linux does. `changes.file` names the open handle the change came through, if any: a
    /// handle opened for writing allows size and time changes without write permission on
    /// the inode (ftruncate on a descriptor is checked against how it was opened).
    pub fn setattr(
        &self,
        inode: u64,
        changes: &SetAttr,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        self.check_writable()?;
        let handle = self.live_inode(inode)?;
        let through_writable = changes.file.is_some_and(handle_is_writable);
        let access_acl = {
            let data = handle.data.lock();
            let write = match through_writable {
                true => Ok(()),
                false => self.permission(inode, &data, who, perm::WRITE),
            };
            flags::check_setattr(&data, changes)?;
            check_setattr(&data, changes, who, write)?;
            match changes.mode {
                Some(_) => self.acls(inode, &data)?.access,
                None => None,
            }
        };
        if let Some(size) = changes.size {
            self.truncate(inode, size)?;
        }
        if let Some(acl) = access_acl {
            self.chmod_with_acl(inode, &acl, |data| apply(data, changes, who))?;
            return self.getattr(inode);
        }
        let mut data = handle.data.lock();
        apply(&mut data, changes, who);
        if data.core.nlink == 0 && only_times(changes) {
            // An unlinked inode's times are not logged: a crash frees it, and whatever
            // changes it later (a link of an O_TMPFILE file, its free) logs its whole image.
            // The kernel sends this after every unlink (the ctime of a writeback-cache inode).
            return Ok(data.attr(inode, self.geometry.block_size));
        }
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        Self::log_inode(&mut tx, inode, &mut data);
        self.commit_inode(tx, &mut data, only_times(changes))?;
        Ok(data.attr(inode, self.geometry.block_size))
    }

    /// Opens `inode`; `truncate` empties a regular file. A writer that does not append.
    pub fn open(
        &self,
        inode: u64,
        write: bool,
        truncate: bool,
        direct: bool,
        who: &Credentials,
    ) -> Result<OpenFile, FsError> {
        let mode = OpenMode {
            write,
            append: false,
            truncate,
            direct,
        };
        self.open_with(inode, &mode, who)
    }

    /// Opens `inode` as `mode` says (the inode's flags may refuse it). A writer of a file
    /// with the sync or the append-only flag gets a direct handle (`handle_is_direct`):
    /// each write of the former is made durable before it returns, and each of the latter
    /// is checked as it is made (`flags.rs`).
    pub fn open_with(
        &self,
        inode: u64,
        mode: &OpenMode,
        who: &Credentials,
    ) -> Result<OpenFile, FsError> {
        let (write, truncate) = (mode.write, mode.truncate);
        let handle = self.live_inode(inode)?;
        let guarded = write && flags::guards_writers(&handle.data.lock());
        let direct = mode.direct || (write && flags::writes_through(&handle.data.lock()));
        if direct {
            // An O_DIRECT open sees the device: cached data goes there first.
            self.settle(&handle)?;
        }
        {
            let data = handle.data.lock();
            let mut mask = perm::READ;
            if write || truncate {
                self.check_writable()?;
                if data.is_dir() {
                    return Err(FsError::IsDirectory);
                }
                mask = if write {
                    perm::WRITE
                } else {
                    perm::READ | perm::WRITE
                };
            }
            self.permission(inode, &data, who, mask)?;
            flags::check_open(&data, mode)?;
        }
        if truncate {
            self.truncate_on_open(inode, &handle, who)?;
        }
        {
            let mut data = handle.data.lock();
            data.opens += 1;
            data.unguarded_writers += u64::from(write && !guarded);
        }
        Ok(OpenFile {
            inode,
            handle: self.new_handle() << 3
                | u64::from(guarded) << 2
                | u64::from(direct) << 1
                | u64::from(write),
        })
    }

    /// Records an access of the inode held by `handle` (a read, a directory listing) as
    /// the mount's atime mode says: never (noatime), always (strictatime), or, by default
    /// (relatime), when the access time is not after the modification or change time or is
    /// a day old. A failed update is ignored, as Linux does: the access itself succeeded.
    pub(crate) fn accessed(&self, number: u64, handle: &Inode) {
        if self.options.read_only || self.options.atime == AtimeMode::Noatime {
            return;
        }
        let mut data = handle.data.lock();
        if flags::keeps_atime(&data) {
            return;
        }
        let now = now();
        let core = &data.core;
        let due = match self.options.atime {
            AtimeMode::Strict => true,
            _ => {
                core.atime <= core.mtime
                    || core.atime <= core.ctime
                    || now.seconds.saturating_sub(core.atime.seconds) >= RELATIME_SECONDS
            }
        };
        if !due || !data.is_allocated() {
            return;
        }
        data.core.atime = now;
        let reservation = Reservation::for_items(&self.geometry, 0, 0, 1, 0);
        if let Ok(mut tx) = self.begin(reservation) {
            Self::log_inode(&mut tx, number, &mut data);
            let _ = self.commit_inode(tx, &mut data, true);
        }
    }

    /// `open(O_TRUNC)`: empties the file and, for callers other than root, clears the
    /// set-ID bits as a truncate does (the kernel leaves both to the open when it lets the
    /// filesystem truncate atomically).
    fn truncate_on_open(
        &self,
        inode: u64,
        handle: &Inode,
        who: &Credentials,
    ) -> Result<(), FsError> {
        if handle.data.lock().core.size > 0 {
            self.truncate(inode, 0)?;
        }
        let mut data = handle.data.lock();
        if perm::clear_set_id_unless_root(&mut data, who) {
            data.core.ctime = now();
            let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
            Self::log_inode(&mut tx, inode, &mut data);
            self.commit(tx, &mut [&mut data])?;
        }
        Ok(())
    }

    /// Closes `file`; the last close of an unlinked inode frees it (its data only, while
    /// the kernel still holds a reference).
    pub fn release(&self, file: OpenFile) -> Result<(), FsError> {
        self.reads.forget_handle(file.handle);
        let handle = self.inode(file.inode)?;
        let (closed, unlinked) = {
            let mut data = handle.data.lock();
            data.opens = data.opens.saturating_sub(1);
            if handle_is_writable(file.handle) && !handle_is_guarded(file.handle) {
                data.unguarded_writers = data.unguarded_writers.saturating_sub(1);
            }
            if data.opens == 0 && data.lookups == 0 {
                self.inodes.note_idle(file.inode);
            }
            (data.opens == 0, data.core.nlink == 0)
        };
        if closed && unlinked {
            crate::unlinked::free_unreferenced(self, &handle)?;
        } else if closed {
            self.write_back_rewritten(&handle);
            self.trim_on_last_close(&handle)?;
        }
        Ok(())
    }

    /// At the last close of a file a truncate emptied (open with `O_TRUNC`, write, close:
    /// how programs rewrite a file in place), writes its new data back, so the checkpoint
    /// that makes the truncate durable is unlikely to find it still cached: a crash then
    /// shows the old content or the new, not an empty file (ext4's `auto_da_alloc`). A
    /// failure is kept for the file's next `fsync`, as any writeback failure.
    fn write_back_rewritten(&self, handle: &Inode) {
        if !std::mem::take(&mut handle.data.lock().emptied_by_truncate) {
            return;
        }
        if let Err(error) = self.write_back_whole(handle) {
            tracing::warn!(inode = handle.number, %error, "writing back a rewritten file failed");
        }
    }
}

/// Whether an open handle was opened for writing (its lowest bit; see `open`).
pub(crate) fn handle_is_writable(handle: u64) -> bool {
    handle & 1 == 1
}

/// Whether an open handle was opened with `O_DIRECT` (its second bit; see `open`): its
/// writes go through `Filesystem::write_direct`. A writer of a file with the sync or the
/// append-only flag gets such a handle too.
pub fn handle_is_direct(handle: u64) -> bool {
    handle & 2 == 2
}

/// Whether a writable handle was opened while its file was append-only (its third bit;
/// see `open_with`): its writes must append.
pub(crate) fn handle_is_guarded(handle: u64) -> bool {
    handle & 4 == 4
}

/// The permission rules of a setattr, as Linux's `setattr_prepare` applies them, adjusted
/// for what the kernel sends on its own behalf: time stamps of a writeback (explicit times
/// through a writable handle), set-to-now times (which arrive as explicit times when the
/// kernel owns them), the set-ID bits it clears for a writer, and ctime, which only the
/// kernel ever stamps. Through FUSE the kernel has already refused what a caller may not do
/// (the mount always has `default_permissions`); these checks keep the library honest.
/// `write` is whether the caller may write the inode, or came through a writable handle.
fn check_setattr(
    data: &InodeData,
    changes: &SetAttr,
    who: &Credentials,
    write: Result<(), FsError>,
) -> Result<(), FsError> {
    let owner = perm::is_owner(data, who);
    let may_write = write.is_ok();
    if let Some(mode) = changes.mode
        && !owner
        && !(perm::only_clears_set_id(data, mode) && may_write)
    {
        return Err(FsError::NotPermitted);
    }
    let changes_owner = |uid: u32| uid != data.core.uid || who.uid != data.core.uid;
    if who.uid != 0 && changes.uid.is_some_and(changes_owner) {
        return Err(FsError::NotPermitted);
    }
    let allowed_group =
        |gid: u32| who.uid == data.core.uid && (who.in_group(gid) || gid == data.core.gid);
    if who.uid != 0 && changes.gid.is_some_and(|gid| !allowed_group(gid)) {
        return Err(FsError::NotPermitted);
    }
    let times = [changes.atime, changes.mtime];
    if !owner && times.iter().any(Option::is_some) && !may_write {
        let explicit = times.iter().any(|t| matches!(t, Some(TimeOrNow::Time(_))));
        return Err(match explicit {
            true => FsError::NotPermitted,
            false => FsError::PermissionDenied,
        });
    }
    if changes.size.is_some() {
        if data.is_dir() {
            return Err(FsError::IsDirectory);
        }
        write?;
    }
    Ok(())
}

/// Whether `changes` sets times and nothing else.
fn only_times(changes: &SetAttr) -> bool {
    let SetAttr {
        mode,
        uid,
        gid,
        size,
        atime,
        mtime,
        ctime,
        file: _,
    } = changes;
    mode.is_none()
        && uid.is_none()
        && gid.is_none()
        && size.is_none()
        && (atime.is_some() || mtime.is_some() || ctime.is_some())
}

fn apply(data: &mut InodeData, changes: &SetAttr, who: &Credentials) {
    let type_bits = data.core.mode & cairn_format::inode::MODE_TYPE_MASK;
    if let Some(mode) = changes.mode {
        let mode = match perm::is_owner(data, who) {
            true => perm::chmod_mode(who, changes.gid.unwrap_or(data.core.gid), mode),
            false => mode & cairn_format::inode::MODE_PERMISSION_MASK,
        };
        data.core.mode = type_bits | mode;
    } else if changes.uid.is_some() || changes.gid.is_some() {
        // A chown clears the set-ID bits even when it changes nothing (Linux's
        // chown_common); a request that also sets the mode says what it wants.
        perm::clear_set_id_on_chown(data, who);
    } else if changes.size.is_some() {
        perm::clear_set_id_unless_root(data, who);
    }
    if let Some(uid) = changes.uid {
        data.core.uid = uid;
    }
    if let Some(gid) = changes.gid {
        data.core.gid = gid;
    }
    let resolve = |t: TimeOrNow| match t {
        TimeOrNow::Now => now(),
        TimeOrNow::Time(time) => timestamp(time),
    };
    if let Some(atime) = changes.atime {
        data.core.atime = resolve(atime);
    }
    if let Some(mtime) = changes.mtime {
        data.core.mtime = resolve(mtime);
    }
    data.core.ctime = changes.ctime.map_or_else(now, timestamp);
}
