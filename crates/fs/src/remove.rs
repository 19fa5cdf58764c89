//! Removing names: unlink and rmdir. An inode whose last link goes is put on the unlinked
//! list in the same transaction, and freed at once if nothing holds it (else on last close
//! or forget).

use std::sync::Arc;

use cairn_journal::Reservation;

use crate::fs::Filesystem;
use crate::inode::{Inode, now};
use crate::namei::valid_name;
use crate::types::Credentials;
use crate::{FsError, dir, unlinked};

impl Filesystem {
    /// Removes the non-directory entry `name` from `parent`.
    pub fn unlink(&self, parent: u64, name: &[u8], who: &Credentials) -> Result<(), FsError> {
        self.remove_name(parent, name, who, false)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&self, parent: u64, name: &[u8], who: &Credentials) -> Result<(), FsError> {
        self.remove_name(parent, name, who, true)
    }

    fn remove_name(
        &self,
        parent: u64,
        name: &[u8],
        who: &Credentials,
        want_dir: bool,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        if want_dir && name == b"." {
            return Err(FsError::InvalidArgument("rmdir of \".\""));
        }
        if want_dir && name == b".." {
            return Err(FsError::NotEmpty);
        }
        valid_name(name)?;
        Self::count(&self.counters.removes, 1);
        let dir_inode = self.live_inode(parent)?;
        let mut dir_data = dir_inode.lock_dir();
        self.check_dir_writable(parent, &dir_data, who)?;
        // The child is found and locked before the transaction: inode locks come before
        // buffers (docs/fs.md, lock order), and the directory's lock keeps the entry.
        let found = self.find_entry(&dir_data, name)?.ok_or(FsError::NotFound)?;
        let child: Arc<Inode> = self.live_inode(found.inode)?;
        let mut data = child.data.lock();
        // The flags and the sticky bit first, as Linux's may_delete orders them.
        crate::flags::may_delete(&dir_data, &data, who)?;
        let mut tx = self.begin(Reservation::remove(&self.geometry))?;
        let checked = match (want_dir, data.is_dir()) {
            (false, true) => Err(FsError::IsDirectory),
            (true, false) => Err(FsError::NotDirectory),
            (true, true) if !dir::is_empty(self, &mut tx, &data)? => Err(FsError::NotEmpty),
            _ => Ok(()),
        };
        if let Err(error) = checked {
            tx.tx.cancel()?;
            return Err(error);
        }
        if want_dir {
            data.core.nlink = 0;
            dir_data.core.nlink = dir_data.core.nlink.saturating_sub(1);
        } else {
            data.core.nlink = data.core.nlink.saturating_sub(1);
        }
        // The AGI before the entry's removal, which may lock AGFs (every AGI before every
        // AGF, docs/fs.md).
        if data.core.nlink == 0 {
            unlinked::add(self, &mut tx, found.inode, &mut data)?;
        }
        dir::remove(self, &mut tx, &mut dir_data, name)?;
        let now = now();
        data.core.ctime = now;
        dir_data.core.mtime = now;
        dir_data.core.ctime = now;
        Self::log_inode(&mut tx, parent, &mut dir_data);
        Self::log_inode(&mut tx, found.inode, &mut data);
        self.commit(tx, &mut [&mut dir_data, &mut data])?;
        let unopened = data.core.nlink == 0 && data.opens == 0;
        drop(data);
        drop(dir_data);
        if unopened {
            unlinked::free_unreferenced(self, &child)?;
        }
        Ok(())
    }
}
