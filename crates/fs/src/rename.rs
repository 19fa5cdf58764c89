//! Rename: move a name within or across directories, replace an existing target, refuse to
//! replace (`NoReplace`), or swap two names (`Exchange`).
//!
//! Lock order. Only rename changes which directory another directory lives in, so renames
//! are serialised by the filesystem-wide rename lock, and while it is held the tree's shape
//! (who is whose ancestor) is fixed. Under it:
//! 1. the two parent directories: an ancestor before its descendant, unrelated ones in
//!    ascending inode order (every other operation locks a parent before its child, so an
//!    ancestor-first order agrees with them);
//! 2. then the source and target inodes, in ascending inode order (neither is an ancestor of
//!    a locked parent: moving a directory into itself is refused, and a target that is an
//!    ancestor of the source's parent is refused before anything is locked);
//! 3. then the transaction and its buffers.
//!
//! Lookups done before locking are checked again under the locks; if a concurrent create or
//! unlink changed either name, the locks are dropped and the rename starts over.

use std::sync::Arc;

use cairn_format::inode::FileType;
use cairn_journal::Reservation;
use cairn_lockrank::MutexGuard;

use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::{Inode, InodeData, now};
use crate::namei::{LINK_MAX, valid_name};
use crate::types::{Credentials, RenameMode};
use crate::{FsError, dir, perm, unlinked};

/// Renames attempted again after a concurrent change before giving up.
const RENAME_RETRIES_MAX: u32 = 64;
/// Why rename may hold two parents: only rename does, under the rename lock, which fixes
/// every directory's ancestry; an ancestor is locked first, unrelated ones by inode number.
const SECOND_PARENT: &str = "rename: second parent, under the rename lock";
/// Why rename may hold its source and target: by inode number, under the parents' locks.
const SECOND_CHILD: &str = "rename: source and target by inode number";
/// Deepest directory tree walked when looking for ancestors.
const DEPTH_MAX: usize = 1 << 16;

/// The two parent directories, locked once each.
pub(crate) enum Parents<'a> {
    Same(MutexGuard<'a, InodeData>),
    Two {
        old: MutexGuard<'a, InodeData>,
        new: MutexGuard<'a, InodeData>,
    },
}

impl Parents<'_> {
    fn source_dir(&mut self) -> &mut InodeData {
        match self {
            Parents::Same(both) => both,
            Parents::Two { old, .. } => old,
        }
    }

    fn target_dir(&mut self) -> &mut InodeData {
        match self {
            Parents::Same(both) => both,
            Parents::Two { new, .. } => new,
        }
    }

    /// Adds `delta` to the link counts: `old` to the old parent's, `new` to the new one's.
    fn add_links(&mut self, old: i64, new: i64) {
        let bump = |data: &mut InodeData, delta: i64| {
            data.core.nlink = (i64::from(data.core.nlink) + delta).max(0) as u32;
        };
        bump(self.source_dir(), old);
        bump(self.target_dir(), new);
    }
}

/// What a rename ends with: an error for the caller, or success with the replaced inode
/// to free once the locks are dropped (nobody has it open).
type Outcome = Result<Option<Arc<Inode>>, FsError>;

/// What one rename names, found before locking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Names {
    source: u64,
    target: Option<u64>,
}

/// One rename request.
pub(crate) struct Request<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub new_parent: u64,
    pub new_name: &'a [u8],
    pub mode: RenameMode,
    /// `RENAME_WHITEOUT`: the inode (no link, on its unlinked list) that takes the source's
    /// name (`whiteout.rs`).
    pub whiteout: Option<Arc<Inode>>,
}

impl<'a> Request<'a> {
    fn parent_name(&self) -> (u64, &'a [u8]) {
        (self.parent, self.name)
    }
}

impl Filesystem {
    /// Renames `name` in `parent` to `new_name` in `new_parent` (see `RenameMode`).
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
        who: &Credentials,
    ) -> Result<(), FsError> {
        let request = Request {
            parent,
            name,
            new_parent,
            new_name,
            mode,
            whiteout: None,
        };
        self.rename_request(&request, who)
    }

    /// Renames as `request` says; see `rename`.
    pub(crate) fn rename_request(
        &self,
        request: &Request<'_>,
        who: &Credentials,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        valid_name(request.name)?;
        valid_name(request.new_name)?;
        Self::count(&self.counters.renames, 1);
        // Before the rename lock: the writeback takes no lock a rename needs, and renames
        // of other files need not wait for this one's data.
        self.write_back_replacement(request);
        let serial = self.rename_lock.lock();
        for _ in 0..RENAME_RETRIES_MAX {
            let Some(done) = self.rename_once(request, who)? else {
                continue;
            };
            // A replaced inode nobody has open is freed (its data at least, while the
            // kernel still holds it) after every rename lock is gone: its data may take
            // many transactions, and its own locks rank below the parents'.
            drop(serial);
            return match done {
                Ok(Some(replaced)) => unlinked::free_unreferenced(self, &replaced),
                Ok(None) => Ok(()),
                Err(error) => Err(error),
            };
        }
        Err(FsError::InvalidArgument(
            "rename raced other changes too often",
        ))
    }

    /// Before a rename replaces a regular file (or exchanges two), writes back the cached
    /// data of the file (or files) moved into place and logs their sizes, so the rename's
    /// transaction commits after them: a crash that keeps the rename keeps that data, and
    /// the name shows the old file or the new one, complete (ext4's `auto_da_alloc`; the
    /// editor's write-to-temporary-then-rename). Best effort: a failure is kept for the
    /// file's next `fsync`, and the rename goes on (as do writes to the file meanwhile,
    /// which a crash may then lose, as any unsynced write).
    fn write_back_replacement(&self, request: &Request<'_>) {
        let replaced = match self.lookup_number(request.new_parent, request.new_name) {
            Ok(target) if request.mode != RenameMode::NoReplace => target,
            _ => return,
        };
        let mut moved = vec![request.parent_name()];
        if request.mode == RenameMode::Exchange {
            moved.push((request.new_parent, request.new_name));
        }
        if !self.is_regular_file(replaced) {
            return;
        }
        for (parent, name) in moved {
            let written = self
                .lookup_number(parent, name)
                .and_then(|number| self.live_inode(number))
                .and_then(|inode| self.write_back_whole(&inode));
            if let Err(error) = written {
                tracing::debug!(%error, "writeback before a replacing rename failed");
            }
        }
    }

    /// Whether `inode` is an allocated regular file.
    fn is_regular_file(&self, inode: u64) -> bool {
        self.live_inode(inode)
            .is_ok_and(|handle| handle.data.lock().file_type() == Some(FileType::Regular))
    }

    /// One attempt; `None` when a name changed between the lookups and the locks.
    fn rename_once(
        &self,
        request: &Request<'_>,
        who: &Credentials,
    ) -> Result<Option<Outcome>, FsError> {
        let source = self.lookup_number(request.parent, request.name)?;
        let target = match self.lookup_number(request.new_parent, request.new_name) {
            Ok(found) => Some(found),
            Err(FsError::NotFound) => None,
            Err(error) => return Err(error),
        };
        let names = Names { source, target };
        if let Some(early) = self.rename_shape_check(request, names)? {
            return Ok(Some(early.map(|()| None)));
        }
        let old_first = self.old_parent_first(request.parent, request.new_parent)?;
        let old_dir = self.live_inode(request.parent)?;
        let new_dir = self.live_inode(request.new_parent)?;
        let mut parents = if request.parent == request.new_parent {
            Parents::Same(old_dir.lock_dir())
        } else if old_first {
            let old = old_dir.lock_dir();
            let new = new_dir.lock_dir_nested(SECOND_PARENT);
            Parents::Two { old, new }
        } else {
            let new = new_dir.lock_dir();
            let old = old_dir.lock_dir_nested(SECOND_PARENT);
            Parents::Two { old, new }
        };
        // Under the parents' locks the names are looked up again, before the transaction:
        // the source's and target's locks come before any buffer (docs/fs.md, lock order).
        if self.names_locked(&mut parents, request)? != Some(names) {
            return Ok(None);
        }
        self.rename_locked(&mut parents, request, names, who)
            .map(Some)
    }

    /// Checks that need no locks: the same inode under both names, moving a directory into
    /// its own subtree, replacing an ancestor of the source. `Some` ends the rename.
    fn rename_shape_check(
        &self,
        request: &Request<'_>,
        names: Names,
    ) -> Result<Option<Result<(), FsError>>, FsError> {
        if names.source == request.parent || names.target == Some(request.new_parent) {
            // A directory entry naming its own directory: locking it twice would deadlock.
            return Err(FsError::corrupt(
                "directory",
                request.parent,
                "an entry names a parent of the rename",
            ));
        }
        if names.target == Some(names.source) {
            // Two names of one inode: POSIX says do nothing.
            return Ok(Some(match request.mode {
                RenameMode::NoReplace => Err(FsError::Exists),
                _ => Ok(()),
            }));
        }
        if request.mode == RenameMode::NoReplace && names.target.is_some() {
            return Ok(Some(Err(FsError::Exists)));
        }
        if request.mode == RenameMode::Exchange && names.target.is_none() {
            return Ok(Some(Err(FsError::NotFound)));
        }
        let new_above = self.ancestors(request.new_parent)?;
        // `new_above` starts with the new parent itself.
        if new_above.contains(&names.source) {
            return Ok(Some(Err(FsError::InvalidArgument(
                "cannot move a directory into itself",
            ))));
        }
        if let Some(target) = names.target {
            let old_above = self.ancestors(request.parent)?;
            if old_above.contains(&target) {
                return Ok(Some(Err(match request.mode {
                    RenameMode::Exchange => {
                        FsError::InvalidArgument("cannot move a directory into itself")
                    }
                    _ => FsError::NotEmpty,
                })));
            }
        }
        Ok(None)
    }

    /// Whether the old parent is locked before the new one: an ancestor goes first, and
    /// unrelated directories go in ascending inode order.
    fn old_parent_first(&self, old: u64, new: u64) -> Result<bool, FsError> {
        if self.ancestors(new)?.contains(&old) {
            return Ok(true);
        }
        if self.ancestors(old)?.contains(&new) {
            return Ok(false);
        }
        Ok(old < new)
    }

    /// `dir` and every directory above it up to the root.
    fn ancestors(&self, dir: u64) -> Result<Vec<u64>, FsError> {
        let mut out = vec![dir];
        let mut current = dir;
        while current != self.root {
            if out.len() > DEPTH_MAX {
                return Err(FsError::corrupt("directory tree", current, "a parent loop"));
            }
            current = self.lookup_number(current, b"..")?;
            out.push(current);
        }
        Ok(out)
    }

    /// Looks both names up again under the parents' locks (no buffer stays held).
    fn names_locked(
        &self,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
    ) -> Result<Option<Names>, FsError> {
        let Some(source) = self.find_entry(parents.source_dir(), request.name)? else {
            return Ok(None);
        };
        let target = self.find_entry(parents.target_dir(), request.new_name)?;
        Ok(Some(Names {
            source: source.inode,
            target: target.map(|t| t.inode),
        }))
    }

    /// The rename with both parents locked and the names checked: locks the source and
    /// target, checks permissions and kinds, changes the entries and commits.
    fn rename_locked(
        &self,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        names: Names,
        who: &Credentials,
    ) -> Result<Outcome, FsError> {
        let source = self.live_inode(names.source)?;
        let target: Option<Arc<Inode>> = names.target.map(|t| self.live_inode(t)).transpose()?;
        let (mut source_data, mut target_data) = match &target {
            Some(target) if target.number < source.number => {
                let target_data = target.data.lock();
                (source.lock_nested(SECOND_CHILD), Some(target_data))
            }
            Some(target) => {
                let source_data = source.data.lock();
                (source_data, Some(target.lock_nested(SECOND_CHILD)))
            }
            None => (source.data.lock(), None),
        };
        let moved = Moved {
            source: (names.source, &mut source_data),
            target: names.target.zip(target_data.as_deref_mut()),
            target_listed: false,
            whiteout: None,
        };
        let done = match &request.whiteout {
            None => {
                let tx = self.begin(rename_reservation(self))?;
                self.rename_in(tx, parents, request, moved, who)?
            }
            Some(whiteout) => self.rename_with_whiteout(whiteout, parents, request, moved, who)?,
        };
        if let Err(error) = done {
            return Ok(Err(error));
        }
        let unopened = target_data
            .as_ref()
            .is_some_and(|data| data.core.nlink == 0 && data.opens == 0);
        drop((source_data, target_data));
        Ok(Ok(target.filter(|_| unopened)))
    }

    /// The rename in `tx`, its inodes locked: checks, the entries' change, the commit. An
    /// error in the inner result leaves nothing changed.
    pub(crate) fn rename_in(
        &self,
        mut tx: Tx<'_>,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        mut moved: Moved<'_>,
        who: &Credentials,
    ) -> Result<Result<(), FsError>, FsError> {
        let (source, target) = (moved.source.0, moved.target.as_ref().map(|t| t.0));
        let checked = self.rename_checks(
            &mut tx,
            parents,
            request,
            (source, &*moved.source.1),
            target.zip(moved.target.as_ref().map(|t| &*t.1)),
            who,
        );
        if let Err(error) = checked {
            tx.tx.cancel()?;
            return Ok(Err(error));
        }
        if let Some(whiteout) = &mut moved.whiteout {
            // Off its list before the target may join one.
            let (number, data) = (whiteout.number, &mut *whiteout.data);
            whiteout.place.take_off(self, &mut tx, number, data)?;
        }
        let changed = match request.mode {
            RenameMode::Exchange => self.exchange_entries(&mut tx, parents, request, &mut moved),
            _ => self.move_entry(&mut tx, parents, request, &mut moved),
        };
        if let Err(error) = changed {
            if moved.target_listed {
                // The target is on the unlinked list but the entries are half changed (only
                // corruption or an I/O error gets here): the transaction must not commit.
                return Err(error);
            }
            if let Some(whiteout) = &mut moved.whiteout {
                // Still unnamed: back on its list, to be freed.
                unlinked::add(self, &mut tx, whiteout.number, whiteout.data)?;
                Self::log_inode(&mut tx, whiteout.number, whiteout.data);
            }
            // Nothing was changed in core (a failed add restores the directory): keep the
            // transaction's consistent allocator changes.
            let deferred = std::mem::take(&mut tx.deferred_frees);
            tx.tx.commit()?;
            crate::dir::finish_deferred_frees(self, deferred)?;
            return Ok(Err(error));
        }
        if let Some(whiteout) = &mut moved.whiteout {
            whiteout.data.core.nlink = 1;
        }
        self.commit_rename(tx, parents, request, moved)?;
        Ok(Ok(()))
    }

    /// Permission, kind, emptiness and link-count checks.
    fn rename_checks(
        &self,
        tx: &mut Tx<'_>,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        (source_number, source): (u64, &InodeData),
        target: Option<(u64, &InodeData)>,
        who: &Credentials,
    ) -> Result<(), FsError> {
        self.check_dir_writable(request.parent, parents.source_dir(), who)?;
        self.check_dir_writable(request.new_parent, parents.target_dir(), who)?;
        crate::flags::may_delete(parents.source_dir(), source, who)?;
        let across = request.parent != request.new_parent;
        if across && source.is_dir() {
            // Its ".." changes.
            self.permission(source_number, source, who, perm::WRITE)?;
        }
        let Some((target_number, target)) = target else {
            if across && source.is_dir() && parents.target_dir().core.nlink >= LINK_MAX {
                return Err(FsError::TooManyLinks);
            }
            return Ok(());
        };
        crate::flags::may_delete(parents.target_dir(), target, who)?;
        if request.mode == RenameMode::Exchange {
            if across && target.is_dir() {
                self.permission(target_number, target, who, perm::WRITE)?;
            }
            return Ok(());
        }
        match (source.is_dir(), target.is_dir()) {
            (true, false) => Err(FsError::NotDirectory),
            (false, true) => Err(FsError::IsDirectory),
            (true, true) if !dir::is_empty(self, tx, target)? => Err(FsError::NotEmpty),
            _ => Ok(()),
        }
    }

    /// Replace and NoReplace: the new name points at the source (added, or the target's entry
    /// retargeted in place), the old name goes, the target loses a link.
    fn move_entry(
        &self,
        tx: &mut Tx<'_>,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        moved: &mut Moved<'_>,
    ) -> Result<(), FsError> {
        // A replaced target loses its link first: its unlinked list's AGI comes before any
        // AGF the entries' changes lock (every AGI before every AGF, docs/fs.md).
        if let Some((number, data)) = &mut moved.target {
            if data.is_dir() {
                data.core.nlink = 0;
                parents.add_links(0, -1);
            } else {
                data.core.nlink = data.core.nlink.saturating_sub(1);
            }
            if data.core.nlink == 0 {
                unlinked::add(self, tx, *number, data)?;
                moved.target_listed = true;
            }
        }
        let (source, source_data) = (moved.source.0, &mut *moved.source.1);
        let source_type = source_data.file_type().unwrap_or(FileType::Regular);
        let is_dir = source_data.is_dir();
        match &mut moved.target {
            None => dir::add(
                self,
                tx,
                parents.target_dir(),
                request.new_name,
                source,
                source_type,
            )?,
            Some(_) => {
                dir::retarget(
                    self,
                    tx,
                    parents.target_dir(),
                    request.new_name,
                    source,
                    source_type,
                )?;
            }
        }
        match &moved.whiteout {
            // The whiteout takes the old name's entry in place (its cookie stays).
            Some(whiteout) => {
                dir::retarget(
                    self,
                    tx,
                    parents.source_dir(),
                    request.name,
                    whiteout.number,
                    FileType::CharDevice,
                )?;
            }
            None => {
                dir::remove(self, tx, parents.source_dir(), request.name)?;
            }
        }
        if is_dir && request.parent != request.new_parent {
            dir::set_parent(self, tx, source_data, request.new_parent)?;
            parents.add_links(-1, 1);
        }
        Ok(())
    }

    /// Exchange: both entries are retargeted in place; directories moving to the other
    /// parent get their ".." changed and move a link between the parents.
    fn exchange_entries(
        &self,
        tx: &mut Tx<'_>,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        moved: &mut Moved<'_>,
    ) -> Result<(), FsError> {
        let (source, source_data) = (moved.source.0, &mut *moved.source.1);
        let Some((target, target_data)) = &mut moved.target else {
            return Err(FsError::NotFound);
        };
        let source_type = source_data.file_type().unwrap_or(FileType::Regular);
        let target_type = target_data.file_type().unwrap_or(FileType::Regular);
        dir::retarget(
            self,
            tx,
            parents.source_dir(),
            request.name,
            *target,
            target_type,
        )?;
        dir::retarget(
            self,
            tx,
            parents.target_dir(),
            request.new_name,
            source,
            source_type,
        )?;
        if request.parent == request.new_parent {
            return Ok(());
        }
        if source_data.is_dir() {
            dir::set_parent(self, tx, source_data, request.new_parent)?;
            parents.add_links(-1, 1);
        }
        if target_data.is_dir() {
            dir::set_parent(self, tx, target_data, request.parent)?;
            parents.add_links(1, -1);
        }
        Ok(())
    }

    /// Sets the times, logs every inode the rename changed and commits.
    fn commit_rename(
        &self,
        mut tx: Tx<'_>,
        parents: &mut Parents<'_>,
        request: &Request<'_>,
        moved: Moved<'_>,
    ) -> Result<(), FsError> {
        let now = now();
        let old = parents.source_dir();
        old.core.mtime = now;
        old.core.ctime = now;
        let new = parents.target_dir();
        new.core.mtime = now;
        new.core.ctime = now;
        Self::log_inode(&mut tx, request.parent, parents.source_dir());
        if request.parent != request.new_parent {
            Self::log_inode(&mut tx, request.new_parent, parents.target_dir());
        }
        let (source, source_data) = moved.source;
        source_data.core.ctime = now;
        Self::log_inode(&mut tx, source, source_data);
        let mut logged: Vec<&mut InodeData> = vec![source_data];
        if let Some((target, target_data)) = moved.target {
            target_data.core.ctime = now;
            Self::log_inode(&mut tx, target, target_data);
            logged.push(target_data);
        }
        let mut place = None;
        if let Some(whiteout) = moved.whiteout {
            whiteout.data.core.ctime = now;
            Self::log_inode(&mut tx, whiteout.number, whiteout.data);
            logged.push(whiteout.data);
            place = Some(whiteout.place);
        }
        // The whiteout's list predecessor was logged when it left the list.
        logged.extend(place.as_mut().and_then(unlinked::ListPlace::predecessor));
        let deferred = std::mem::take(&mut tx.deferred_frees);
        let sequence = tx.tx.commit()?.0;
        for data in logged {
            data.committed(sequence, false);
        }
        parents.source_dir().committed(sequence, false);
        parents.target_dir().committed(sequence, false);
        crate::dir::finish_deferred_frees(self, deferred)
    }
}

/// The source and target inodes of a rename, locked.
pub(crate) struct Moved<'a> {
    source: (u64, &'a mut InodeData),
    target: Option<(u64, &'a mut InodeData)>,
    /// The target lost its last link and joined the unlinked list in the transaction.
    target_listed: bool,
    /// With `RENAME_WHITEOUT`: the whiteout, locked, and its place on its unlinked list.
    whiteout: Option<MovedWhiteout<'a>>,
}

impl<'a> Moved<'a> {
    /// The target's inode number, if the rename has a target.
    pub(crate) fn target_number(&self) -> Option<u64> {
        self.target.as_ref().map(|(number, _)| *number)
    }

    /// The same rename, with `whiteout` taking the source's name.
    pub(crate) fn with_whiteout(self, whiteout: MovedWhiteout<'a>) -> Self {
        Self {
            whiteout: Some(whiteout),
            ..self
        }
    }
}

/// A whiteout taking the source's name: its number, its locked data, and where it sits
/// on its unlinked list until the rename takes it off.
pub(crate) struct MovedWhiteout<'a> {
    pub number: u64,
    pub data: &'a mut InodeData,
    pub place: unlinked::ListPlace<'a>,
}

/// Rename's log reservation: both directories' data blocks and hash-tree paths
/// (`2 * (2 + BTREE_LEVELS_MAX)`), a new directory block's allocation (AGF, AGFL, both
/// free-space-tree paths: `2 + 2 * BTREE_LEVELS_MAX`), the AGI of the unlinked bucket; the
/// two parents, source, target and the unlinked-list neighbour (five inodes); one intent.
pub(crate) fn rename_reservation(fs: &Filesystem) -> Reservation {
    let levels = cairn_format::limits::BTREE_LEVELS_MAX;
    let buffers = 2 * (2 + levels) + 2 + 2 * levels + 1;
    Reservation::for_items(&fs.geometry, buffers, fs.geometry.block_size, 5, 1)
}
