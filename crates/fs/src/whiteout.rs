//! `RENAME_WHITEOUT`: a rename that leaves a whiteout (a character device 0/0, overlayfs's
//! mark of a removed lower file) under the source's name, in the rename's transaction.
//!
//! As XFS does, the whiteout is made first as an unnamed inode with no link, on its AG's
//! unlinked list (`make` with no name, in a transaction of its own): allocating it inside
//! the rename would lock its AGI, and maybe an AGF for a new chunk, after the AGI a replaced
//! target's unlinked list needs. The rename's transaction then locks both AGIs in
//! ascending order (`unlinked::relink`), retargets the source's entry to the whiteout in
//! place, takes the whiteout off its list and gives it its link. A crash before that
//! transaction leaves an unlinked inode that mount frees; after it, the whiteout and the
//! moved name together. A rename that fails or does nothing frees the whiteout again.

use std::sync::Arc;

use cairn_format::inode::FileType;
use cairn_journal::inode_item_bytes;

use crate::fs::Filesystem;
use crate::inode::Inode;
use crate::namei::{NewInode, SplitAg, valid_name};
use crate::rename::{Moved, MovedWhiteout, Parents, Request, rename_reservation};
use crate::types::{Credentials, RenameMode};
use crate::{FsError, unlinked};

/// Why a rename may lock the whiteout while holding its source and target: it is new, on
/// an unlinked list, and nothing names it, so nobody else waits while holding it.
const WHITEOUT: &str = "rename: the whiteout, new and named by nothing";

impl Filesystem {
    /// `rename` with `RENAME_WHITEOUT`: the source's name is not removed but names a new
    /// whiteout, a character device 0/0 (mode 0, the caller's owner), in the rename's
    /// transaction. `mode` is `Replace` or `NoReplace`; `Exchange` is `InvalidArgument`,
    /// as Linux refuses the pair.
    pub fn rename_whiteout(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
        who: &Credentials,
    ) -> Result<(), FsError> {
        if mode == RenameMode::Exchange {
            return Err(FsError::InvalidArgument(
                "a rename cannot both exchange and leave a whiteout",
            ));
        }
        self.check_writable()?;
        valid_name(name)?;
        valid_name(new_name)?;
        let whiteout = self.make_whiteout(parent, who)?;
        let request = Request {
            parent,
            name,
            new_parent,
            new_name,
            mode,
            whiteout: Some(Arc::clone(&whiteout)),
        };
        let renamed = self.rename_request(&request, who);
        drop(request);
        if whiteout.data.lock().core.nlink == 0 {
            // The rename failed, or had nothing to do (two names of one inode).
            let freed = unlinked::free_orphan(self, &whiteout);
            if renamed.is_ok() {
                freed?;
            }
        }
        renamed
    }

    /// A whiteout for directory `parent`: a character device 0/0 with no link, on its
    /// unlinked list, referenced by nothing.
    fn make_whiteout(&self, parent: u64, who: &Credentials) -> Result<Arc<Inode>, FsError> {
        let new = NewInode {
            file_type: FileType::CharDevice,
            mode: 0,
            rdev: 0,
            symlink_target: None,
            plain: true,
        };
        let attr = self.make(parent, None, &new, who)?;
        let inode = self.live_inode(attr.inode)?;
        // `make` took a lookup reference for a caller; nobody holds this one.
        inode.data.lock().lookups -= 1;
        Ok(inode)
    }

    /// The rename of `moved` with `whiteout` taking the source's name: the whiteout and
    /// its list predecessor locked, both AGIs locked in order (`unlinked::relink`).
    pub(crate) fn rename_with_whiteout(
        &self,
        whiteout: &Inode,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        moved: Moved<'_>,
        who: &Credentials,
    ) -> Result<Result<(), FsError>, FsError> {
        let mut data = whiteout.lock_nested(WHITEOUT);
        let target_ag = moved.target_number().map(|t| self.geometry.split_ag(t));
        let mut reservation = rename_reservation(self);
        // The whiteout and its predecessor on its list.
        reservation.bytes += 2 * inode_item_bytes(u64::from(self.geometry.inode_size));
        let agis: Vec<u32> = target_ag.into_iter().collect();
        unlinked::relink(self, whiteout.number, reservation, &agis, |tx, place| {
            let moved = moved.with_whiteout(MovedWhiteout {
                number: whiteout.number,
                data: &mut data,
                place,
            });
            self.rename_in(tx, parents, request, moved, who)
        })
    }
}
