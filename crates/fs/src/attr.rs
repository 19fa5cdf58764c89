//! Attribute changes (chmod, chown, truncate, times) and open/release.

use std::time::SystemTime;

use cairn_journal::Reservation;

use crate::fs::Filesystem;
use crate::inode::{InodeData, now, timestamp};
use crate::types::{Attr, Credentials, OpenFile, SetAttr, TimeOrNow};
use crate::{FsError, perm};

impl Filesystem {
    /// Applies `changes`; a size change truncates. Clears setuid/setgid where POSIX says.
    pub fn setattr(
        &self,
        inode: u64,
        changes: &SetAttr,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        self.check_writable()?;
        let handle = self.live_inode(inode)?;
        if let Some(size) = changes.size {
            {
                let data = handle.data.lock();
                perm::check(&data, who, perm::WRITE)?;
            }
            self.truncate(inode, size)?;
        }
        let mut data = handle.data.lock();
        check_setattr(&data, changes, who)?;
        apply(&mut data, changes, who);
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        Self::log_inode(&mut tx, inode, &mut data);
        Self::commit(tx, &mut [&mut data])?;
        Ok(data.attr(inode, self.geometry.block_size))
    }

    /// Opens `inode`; `truncate` empties a regular file.
    pub fn open(
        &self,
        inode: u64,
        write: bool,
        truncate: bool,
        direct: bool,
        who: &Credentials,
    ) -> Result<OpenFile, FsError> {
        let _ = direct; // every data transfer is direct to the device already
        let handle = self.live_inode(inode)?;
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
            perm::check(&data, who, mask)?;
        }
        if truncate && handle.data.lock().core.size > 0 {
            self.truncate(inode, 0)?;
        }
        handle.data.lock().opens += 1;
        Ok(OpenFile {
            inode,
            handle: self.new_handle(),
        })
    }

    /// Closes `file`; the last close of an unlinked inode frees it.
    pub fn release(&self, file: OpenFile) -> Result<(), FsError> {
        let handle = self.inode(file.inode)?;
        let free = {
            let mut data = handle.data.lock();
            data.opens = data.opens.saturating_sub(1);
            if data.opens == 0 && data.lookups == 0 {
                self.inodes.note_idle(file.inode);
            }
            data.opens == 0 && data.lookups == 0 && data.core.nlink == 0 && data.is_allocated()
        };
        if free {
            crate::unlinked::free_orphan(self, &handle)?;
        } else if handle.data.lock().opens == 0 {
            self.trim_on_last_close(&handle)?;
        }
        Ok(())
    }
}

fn check_setattr(data: &InodeData, changes: &SetAttr, who: &Credentials) -> Result<(), FsError> {
    let owner = perm::is_owner(data, who);
    if changes.mode.is_some() && !owner {
        return Err(FsError::NotPermitted);
    }
    if let Some(uid) = changes.uid
        && uid != data.core.uid
        && who.uid != 0
    {
        return Err(FsError::NotPermitted);
    }
    if let Some(gid) = changes.gid
        && gid != data.core.gid
        && who.uid != 0
        && !(owner && who.in_group(gid))
    {
        return Err(FsError::NotPermitted);
    }
    let explicit = |t: Option<TimeOrNow>| matches!(t, Some(TimeOrNow::Time(_)));
    if (explicit(changes.atime) || explicit(changes.mtime) || changes.ctime.is_some()) && !owner {
        return Err(FsError::NotPermitted);
    }
    let to_now = |t: Option<TimeOrNow>| matches!(t, Some(TimeOrNow::Now));
    if (to_now(changes.atime) || to_now(changes.mtime)) && !owner {
        perm::check(data, who, perm::WRITE)?;
    }
    Ok(())
}

fn apply(data: &mut InodeData, changes: &SetAttr, who: &Credentials) {
    let type_bits = data.core.mode & cairn_format::inode::MODE_TYPE_MASK;
    if let Some(mode) = changes.mode {
        data.core.mode = type_bits | perm::chmod_mode(data, who, mode);
    }
    let owner_change = changes.uid.is_some_and(|u| u != data.core.uid)
        || changes.gid.is_some_and(|g| g != data.core.gid);
    if let Some(uid) = changes.uid {
        data.core.uid = uid;
    }
    if let Some(gid) = changes.gid {
        data.core.gid = gid;
    }
    // chown clears setuid/setgid for everyone, a truncate for callers other than root.
    let truncated = changes.size.is_some() && who.uid != 0;
    if (owner_change || truncated) && changes.mode.is_none() && !data.is_dir() {
        perm::kill_suid(data);
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
    let _: Option<SystemTime> = None;
}
