//! `O_TMPFILE`: an unnamed regular file, unlinked from birth, and its first name.
//!
//! The inode is allocated with no link and put on its AG's unlinked list in the transaction
//! that allocates it, so a crash at any later point frees it at mount, as any unlinked inode
//! (XFS puts its tmpfiles on the unlinked list the same way). Its mode, owner and ACLs come
//! from the directory as for `create` (umask or default ACL). `linkat` from
//! `/proc/self/fd/N` gives it a name unless it was opened `O_EXCL`: one transaction takes it
//! off its list (its AGI before any AGF the directory's growth locks), adds the entry and
//! sets one link; if the entry cannot be added the inode goes back on the list in the same
//! transaction. The last close of one never linked frees it (`release`).

use cairn_format::inode::FileType;
use cairn_journal::{Reservation, inode_item_bytes};

use crate::fs::Filesystem;
use crate::inode::{InodeData, now};
use crate::namei::NewInode;
use crate::types::{Attr, Credentials};
use crate::{FsError, dir, unlinked};

impl Filesystem {
    /// Creates an unnamed regular file for directory `parent` (`O_TMPFILE`): no link, on
    /// the unlinked list from birth, so a crash frees it; mode, umask and default ACLs apply
    /// as for `create`. Takes a lookup reference. Unless `exclusive` (`O_EXCL`), `link` may
    /// give it a name, once.
    pub fn tmpfile(
        &self,
        parent: u64,
        mode: u16,
        exclusive: bool,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        let new = NewInode {
            file_type: FileType::Regular,
            mode,
            rdev: 0,
            symlink_target: None,
            plain: false,
        };
        let attr = self.make(parent, None, &new, who)?;
        self.live_inode(attr.inode)?.data.lock().linkable = !exclusive;
        Ok(attr)
    }

    /// `link` of an O_TMPFILE inode (no link, on its unlinked list, `linkable`), locked by
    /// the caller with its new directory: off the list, into the directory, one link; takes
    /// a lookup reference.
    pub(crate) fn link_unnamed(
        &self,
        (number, data): (u64, &mut InodeData),
        (dir_number, dir_data): (u64, &mut InodeData),
        name: &[u8],
    ) -> Result<Attr, FsError> {
        debug_assert!(data.linkable && data.core.nlink == 0);
        let mut reservation = Reservation::create(&self.geometry);
        // The inode's predecessor on its list is logged too.
        reservation.bytes += inode_item_bytes(u64::from(self.geometry.inode_size));
        let file_type = data.file_type().unwrap_or(FileType::Regular);
        unlinked::relink(self, number, reservation, &[], |mut tx, mut place| {
            if dir::lookup(self, &mut tx, dir_data, name)?.is_some() {
                tx.tx.cancel()?;
                return Err(FsError::Exists);
            }
            place.take_off(self, &mut tx, number, data)?;
            let added = dir::add(self, &mut tx, dir_data, name, number, file_type);
            if let Err(error) = added {
                // Still unnamed: back on its list, at its bucket's head.
                unlinked::add(self, &mut tx, number, data)?;
                Self::log_inode(&mut tx, number, data);
                let mut logged: Vec<&mut InodeData> = vec![data];
                logged.extend(place.predecessor());
                self.commit(tx, &mut logged)?;
                return Err(error);
            }
            let now = now();
            data.core.nlink = 1;
            data.core.ctime = now;
            data.linkable = false;
            dir_data.core.mtime = now;
            dir_data.core.ctime = now;
            Self::log_inode(&mut tx, dir_number, dir_data);
            Self::log_inode(&mut tx, number, data);
            let mut logged: Vec<&mut InodeData> = vec![&mut *dir_data, &mut *data];
            logged.extend(place.predecessor());
            self.commit(tx, &mut logged)?;
            data.lookups += 1;
            Ok(data.attr(number, self.geometry.block_size))
        })
    }
}
