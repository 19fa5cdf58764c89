//! Namespace operations: lookup, create (files, devices, FIFOs, sockets), mkdir, symlink,
//! link, readdir, getattr and access. Removal and rename live in `remove.rs`/`rename.rs`.
//!
//! Locking: the parent directory's metadata lock is taken first, then the child's; the
//! transaction begins after the locks, and its buffers are locked inside it.

use std::sync::Arc;

use cairn_bufcache::BufKey;
use cairn_format::acl::Acl;
use cairn_format::dir::check_name;
use cairn_format::inode::{FileType, ForkFormat, InodeCore, MODE_PERMISSION_MASK};
use cairn_format::limits::NAME_LEN_MAX;
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{Expected, MetaKind};
use cairn_journal::Reservation;

use crate::bmap::step_reservation;
use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::{Inode, InodeData, file_type_of, inode_home, kind_of, now};
use crate::types::{Attr, Credentials, DirEntry, FileKind};
use crate::{FsError, acl, dir, ialloc, perm, symlink, unlinked, xattr_store};

/// Checks a name from the API: length, then the bytes.
pub(crate) fn valid_name(name: &[u8]) -> Result<(), FsError> {
    if name.len() > NAME_LEN_MAX {
        return Err(FsError::NameTooLong);
    }
    check_name(name).map_err(|_| FsError::InvalidName)
}

/// What a new inode takes from its parent: the permission bits and the POSIX ACLs.
#[derive(Debug)]
pub(crate) struct Inherited {
    pub mode: u16,
    pub access: Option<Acl>,
    pub default: Option<Arc<Acl>>,
}

/// What a new inode is.
#[derive(Clone, Copy)]
pub(crate) struct NewInode<'a> {
    pub file_type: FileType,
    pub mode: u16,
    pub rdev: u32,
    pub symlink_target: Option<&'a [u8]>,
    /// Takes neither the umask nor the parent's default ACL (symlinks, whiteouts).
    pub plain: bool,
}

impl Filesystem {
    /// Looks up `name` in `parent` and takes one lookup reference on the result. "." names
    /// `parent` itself, whatever its type (see `lookup_inode`).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        Self::count(&self.counters.lookups, 1);
        if name.len() > NAME_LEN_MAX {
            return Err(FsError::NameTooLong);
        }
        if name == b"." {
            return self.lookup_inode(parent);
        }
        let number = self.lookup_number(parent, name)?;
        let inode = self.live_inode(number)?;
        let mut data = inode.data.lock();
        data.lookups += 1;
        Ok(data.attr(number, self.geometry.block_size))
    }

    /// Takes a lookup reference on inode `number` itself: how the kernel finds an inode
    /// from a file handle (NFS export, `open_by_handle_at`) once it has forgotten it. The
    /// number is untrusted, so one the inode trees do not show allocated is `NotFound` (the
    /// kernel answers ESTALE) before anything reads its cluster; so is an unlinked inode
    /// that only waits for its last references to go (the kernel, which forgot it, holds
    /// none that matter). The caller compares the generation, which every reuse changes.
    pub fn lookup_inode(&self, number: u64) -> Result<Attr, FsError> {
        let known = self.inodes.cached(number).is_some();
        if !known && !ialloc::inode_in_use(self, number)? {
            return Err(FsError::NotFound);
        }
        let inode = self.live_inode(number)?;
        let mut data = inode.data.lock();
        if data.core.nlink == 0 && data.opens == 0 {
            return Err(FsError::NotFound);
        }
        data.lookups += 1;
        Ok(data.attr(number, self.geometry.block_size))
    }

    /// The inode number `name` names in `parent` ("." and ".." included).
    pub(crate) fn lookup_number(&self, parent: u64, name: &[u8]) -> Result<u64, FsError> {
        let dir_inode = self.live_inode(parent)?;
        let dir_data = dir_inode.lock_dir();
        if !dir_data.is_dir() {
            return Err(FsError::NotDirectory);
        }
        let mut tx = self.begin(Reservation::new(0))?;
        let found = match name {
            b"." => Ok(Some(parent)),
            b".." => dir::parent(self, &mut tx, &dir_data).map(Some),
            _ => dir::lookup(self, &mut tx, &dir_data, name).map(|f| f.map(|f| f.inode)),
        };
        tx.tx.cancel()?;
        found?.ok_or(FsError::NotFound)
    }

    /// Looks `name` up in a directory whose lock the caller holds, in a transaction of its
    /// own that holds no buffer on return: callers lock the inode found before they begin
    /// the transaction that changes the entry (inode locks come before buffers).
    pub(crate) fn find_entry(
        &self,
        dir_data: &InodeData,
        name: &[u8],
    ) -> Result<Option<dir::Found>, FsError> {
        let mut tx = self.begin(Reservation::new(0))?;
        let found = dir::lookup(self, &mut tx, dir_data, name);
        tx.tx.cancel()?;
        found
    }

    /// Drops `lookups` lookup references; an unlinked inode is freed once nothing holds it.
    pub fn forget(&self, inode: u64, lookups: u64) {
        let Ok(handle) = self.inode(inode) else {
            return;
        };
        let free = {
            let mut data = handle.data.lock();
            data.lookups = data.lookups.saturating_sub(lookups);
            if data.lookups == 0 && data.opens == 0 {
                self.inodes.note_idle(inode);
            }
            data.lookups == 0 && data.opens == 0 && data.core.nlink == 0 && data.is_allocated()
        };
        if free {
            // Errors here leave the inode on the unlinked list; the next mount frees it.
            let _ = crate::unlinked::free_orphan(self, &handle);
        }
    }

    /// The attributes of `inode`.
    pub fn getattr(&self, inode: u64) -> Result<Attr, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        Ok(data.attr(inode, self.geometry.block_size))
    }

    /// Checks access `mask` (R=4, W=2, X=1; 0 = existence) for `who`.
    pub fn access(&self, inode: u64, mask: u32, who: &Credentials) -> Result<(), FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        if mask & perm::WRITE != 0 {
            self.check_writable()?;
        }
        self.permission(inode, &data, who, mask & 7)
    }

    /// Creates a file, device, FIFO or socket (not a directory or symlink); takes a lookup
    /// reference on it.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        mode: u16,
        rdev: u32,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(FsError::InvalidArgument(
                "create makes no directories or symlinks",
            ));
        }
        let new = NewInode {
            file_type: file_type_of(kind),
            mode,
            rdev,
            symlink_target: None,
            plain: false,
        };
        self.make(parent, Some(name), &new, who)
    }

    /// Creates a directory; takes a lookup reference on it.
    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u16,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        let new = NewInode {
            file_type: FileType::Directory,
            mode,
            rdev: 0,
            symlink_target: None,
            plain: false,
        };
        self.make(parent, Some(name), &new, who)
    }

    /// Creates a symlink to `target`; takes a lookup reference on it.
    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        symlink::check_target(target)?;
        let new = NewInode {
            file_type: FileType::Symlink,
            mode: 0o777,
            rdev: 0,
            symlink_target: Some(target),
            plain: true,
        };
        self.make(parent, Some(name), &new, who)
    }

    /// The common path of every create: checks, allocate, initialise, link into `parent`
    /// as `name`; with no name, an unnamed inode on the unlinked list (`tmpfile`).
    pub(crate) fn make(
        &self,
        parent: u64,
        name: Option<&[u8]>,
        new: &NewInode<'_>,
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        self.check_writable()?;
        name.map(valid_name).transpose()?;
        Self::count(&self.counters.creates, 1);
        let dir_inode = self.live_inode(parent)?;
        let mut dir_data = dir_inode.lock_dir();
        self.check_dir_writable(parent, &dir_data, who)?;
        if new.file_type == FileType::Directory && dir_data.core.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        let inherited = self.inherited(parent, &dir_data, new, who)?;
        let mut reservation = Reservation::create(&self.geometry);
        if inherited.access.is_some() || inherited.default.is_some() {
            reservation.bytes += step_reservation(self).bytes;
        }
        let new = &NewInode {
            mode: inherited.mode,
            ..*new
        };
        // Each failed chunk attempt marks its AG, so the attempts are bounded by the AGs.
        for _ in 0..=self.geometry.ag_count {
            let mut tx = self.begin(reservation)?;
            if let Some(name) = name
                && dir::lookup(self, &mut tx, &dir_data, name)?.is_some()
            {
                tx.tx.cancel()?;
                return Err(FsError::Exists);
            }
            let made = self.make_in(&mut tx, parent, &mut dir_data, name, (new, &inherited), who);
            match made {
                Ok(Some(inode)) if name.is_none() => return self.commit_unnamed(tx, &inode),
                Ok(Some(inode)) => return self.commit_made(tx, parent, &mut dir_data, &inode),
                // An AG's AGF was locked for a chunk it could not place: another AGI may
                // only be locked in a new transaction (every AGI before every AGF).
                Ok(None) => self.commit_failed(tx)?,
                Err(error) => {
                    self.commit_failed(tx)?;
                    return Err(error);
                }
            }
        }
        Err(FsError::NoSpace)
    }

    /// Logs a made inode and its directory, commits, and takes the lookup reference.
    fn commit_made(
        &self,
        mut tx: Tx<'_>,
        parent: u64,
        dir_data: &mut InodeData,
        inode: &Inode,
    ) -> Result<Attr, FsError> {
        let mut data = inode.lock_fresh();
        Self::log_inode(&mut tx, parent, dir_data);
        Self::log_inode(&mut tx, inode.number, &mut data);
        self.commit(tx, &mut [dir_data, &mut data])?;
        data.lookups += 1;
        Ok(data.attr(inode.number, self.geometry.block_size))
    }

    /// Logs a made unnamed inode (its directory is unchanged), commits, and takes the
    /// lookup reference.
    fn commit_unnamed(&self, mut tx: Tx<'_>, inode: &Inode) -> Result<Attr, FsError> {
        let mut data = inode.lock_fresh();
        Self::log_inode(&mut tx, inode.number, &mut data);
        self.commit(tx, &mut [&mut data])?;
        data.lookups += 1;
        Ok(data.attr(inode.number, self.geometry.block_size))
    }

    /// Commits a create or link whose directory change failed: whatever changed (a free-list
    /// refill, an undone allocation, split blocks given back under a free intent) is
    /// consistent; then frees what the change deferred.
    fn commit_failed(&self, mut tx: Tx<'_>) -> Result<(), FsError> {
        let deferred = std::mem::take(&mut tx.deferred_frees);
        tx.tx.commit()?;
        dir::finish_deferred_frees(self, deferred)
    }

    /// Allocates and initialises the inode and adds its entry (with no name: puts it on its
    /// unlinked list, with no link); on failure after the allocation the inode is freed
    /// again in the same transaction. `None`: try again in a new transaction
    /// (`ialloc::InodeAlloc::TryAgain`).
    fn make_in(
        &self,
        tx: &mut Tx<'_>,
        parent: u64,
        dir_data: &mut InodeData,
        name: Option<&[u8]>,
        (new, inherited): (&NewInode<'_>, &Inherited),
        who: &Credentials,
    ) -> Result<Option<Arc<Inode>>, FsError> {
        let ag = match new.file_type {
            FileType::Directory => self.next_dir_ag(),
            _ => self.geometry.split_ag(parent),
        };
        let number = match ialloc::allocate_inode(self, tx, ag)? {
            ialloc::InodeAlloc::Allocated(number) => number,
            ialloc::InodeAlloc::TryAgain => return Ok(None),
        };
        let inode = self.fresh_inode(tx, number)?;
        let mut listed = false;
        let added = {
            let mut data = inode.lock_fresh();
            self.init_inode(tx, &mut data, dir_data, parent, new, who)
                .and_then(|()| match name {
                    Some(_) => Ok(()),
                    // Its AGI is this transaction's already (it allocated the inode), and
                    // comes before any AGF the attributes may lock.
                    None => {
                        data.core.nlink = 0;
                        listed = true;
                        unlinked::add(self, tx, number, &mut data)
                    }
                })
                .and_then(|()| xattr_store::store_new(self, tx, number, &mut data, inherited))
                .and_then(|()| match name {
                    Some(name) => dir::add(self, tx, dir_data, name, number, new.file_type),
                    None => Ok(()),
                })
        };
        if let Err(error) = added {
            let mut data = inode.lock_fresh();
            if listed {
                unlinked::take_off_new(self, tx, number, &mut data)?;
            }
            if new.file_type == FileType::Symlink {
                symlink::release_new(self, tx, &mut data)?;
            }
            xattr_store::release_new(self, tx, number, &mut data)?;
            // As free as `unlinked::free_now` leaves an inode: fsck checks free ones.
            data.core.mode = 0;
            data.core.nlink = 0;
            data.core.size = 0;
            data.reset_data_fork(ForkFormat::Extents);
            Self::log_inode(tx, number, &mut data);
            ialloc::free_inode(self, tx, number)?;
            return Err(error);
        }
        if name.is_none() {
            return Ok(Some(inode));
        }
        let now = now();
        dir_data.core.mtime = now;
        dir_data.core.ctime = now;
        if new.file_type == FileType::Directory {
            dir_data.core.nlink += 1;
        }
        Ok(Some(inode))
    }

    /// The mode a new inode gets and the ACLs it inherits: with a default ACL on the parent,
    /// the ACL decides the permission bits (the umask does not apply) and the new inode's
    /// access ACL is cut from it, and a new directory inherits it as its own default;
    /// without one, the caller's umask applies. Symlinks and whiteouts take neither.
    fn inherited(
        &self,
        parent: u64,
        dir_data: &InodeData,
        new: &NewInode<'_>,
        who: &Credentials,
    ) -> Result<Inherited, FsError> {
        let requested = new.mode & MODE_PERMISSION_MASK;
        let plain = |mode| Inherited {
            mode,
            access: None,
            default: None,
        };
        if new.plain {
            return Ok(plain(requested));
        }
        let default = match dir_data.core.attr_format {
            Some(_) => self.acls(parent, dir_data)?.default,
            None => None,
        };
        let Some(default) = default else {
            return Ok(plain(requested & !(who.umask & 0o777)));
        };
        let (bits, access) = acl::inherit(&default, requested & 0o777);
        let is_dir = new.file_type == FileType::Directory;
        Ok(Inherited {
            mode: (requested & !0o777) | bits,
            access,
            default: is_dir.then_some(default),
        })
    }

    /// Fills in a newly allocated inode.
    fn init_inode(
        &self,
        tx: &mut Tx<'_>,
        data: &mut InodeData,
        parent_data: &InodeData,
        parent: u64,
        new: &NewInode<'_>,
        who: &Credentials,
    ) -> Result<(), FsError> {
        let is_dir = new.file_type == FileType::Directory;
        let (gid, mode) = perm::inherit(parent_data, who, is_dir, new.mode & MODE_PERMISSION_MASK);
        let now = now();
        let core = &mut data.core;
        core.mode = new.file_type.mode_bits() | mode;
        core.uid = who.uid;
        core.gid = gid;
        core.nlink = if is_dir { 2 } else { 1 };
        core.generation = core.generation.wrapping_add(1);
        core.flags = 0;
        core.size = 0;
        core.block_count = 0;
        (core.atime, core.mtime, core.ctime, core.btime) = (now, now, now, now);
        core.next_unlinked = NULL_AG_INODE;
        core.rdev = 0;
        core.attr_format = None;
        core.attr_offset = 0;
        core.attr_extent_count = 0;
        crate::flags::inherit(&parent_data.core, core, new.file_type);
        let literal_end = data.raw.len();
        data.raw[cairn_format::inode::INODE_CORE_SIZE..literal_end].fill(0);
        match new.file_type {
            FileType::Directory => dir::init(data, parent),
            FileType::Symlink => {
                let target = new.symlink_target.unwrap_or_default();
                symlink::store(self, tx, data, target)
            }
            FileType::Regular => {
                data.reset_data_fork(ForkFormat::Extents);
                Ok(())
            }
            _ => {
                data.reset_data_fork(ForkFormat::Device);
                data.core.rdev = new.rdev;
                Ok(())
            }
        }
    }

    /// The in-core inode for a number just allocated in `tx`: the cached copy, or one read
    /// through the transaction (its cluster may be a new buffer the transaction holds).
    fn fresh_inode(&self, tx: &mut Tx<'_>, number: u64) -> Result<Arc<Inode>, FsError> {
        if let Some(inode) = self.inodes.cached(number) {
            return Ok(inode);
        }
        let (key, offset): (BufKey, usize) =
            inode_home(&self.geometry, number).ok_or(FsError::NotFound)?;
        let guard = tx.tx.get_buf(key, &self.cluster_spec)?;
        let size = self.geometry.inode_size as usize;
        let raw = guard
            .get(offset..offset + size)
            .ok_or_else(|| FsError::corrupt("inode", number, "outside its cluster"))?
            .to_vec();
        let expected = Expected {
            kind: MetaKind::Inode,
            blkno: number,
            uuid: self.uuid,
            owner: Some(number),
        };
        let core = InodeCore::read(&raw, &expected)
            .map_err(|e| FsError::corrupt("inode", number, e.to_string()))?;
        if core.mode != 0 {
            return Err(FsError::corrupt(
                "inode",
                number,
                "free in the tree but in use",
            ));
        }
        let inode = Inode::new(
            number,
            InodeData {
                disk_size: core.size,
                emptied_by_truncate: false,
                core,
                raw,
                last_sequence: 0,
                datasync_sequence: 0,
                lookups: 0,
                opens: 0,
                acls: Default::default(),
                delayed_blocks: 0,
                unguarded_writers: 0,
                linkable: false,
            },
        );
        Ok(self.inodes.insert(inode))
    }

    /// The AG for a new directory: round robin, spreading directory trees over the AGs.
    fn next_dir_ag(&self) -> u32 {
        let next = self
            .dir_rotor
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        next % self.geometry.ag_count
    }

    /// Reads a directory: ".", "..", then the entries after `cookie`.
    pub fn readdir(
        &self,
        inode: u64,
        cookie: u64,
        max_entries: usize,
    ) -> Result<Vec<DirEntry>, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.lock_dir();
        if !data.is_dir() {
            return Err(FsError::NotDirectory);
        }
        let mut tx = self.begin(Reservation::new(0))?;
        let result = self.readdir_in(&mut tx, inode, &data, cookie, max_entries);
        tx.tx.cancel()?;
        drop(data);
        if result.is_ok() {
            self.accessed(inode, &handle);
        }
        result
    }

    fn readdir_in(
        &self,
        tx: &mut Tx<'_>,
        inode: u64,
        data: &InodeData,
        cookie: u64,
        max_entries: usize,
    ) -> Result<Vec<DirEntry>, FsError> {
        let mut out = Vec::new();
        if cookie < 1 && out.len() < max_entries {
            out.push(dot(b".", inode, 1));
        }
        if cookie < 2 && out.len() < max_entries {
            out.push(dot(b"..", dir::parent(self, tx, data)?, 2));
        }
        let room = max_entries - out.len();
        for found in dir::entries(self, tx, data, cookie, room)? {
            out.push(DirEntry {
                name: found.name,
                inode: found.inode,
                kind: kind_of(Some(found.file_type)),
                cookie: found.cookie,
            });
        }
        Ok(out)
    }

    /// Adds a hard link to `inode` as `new_name` in `new_parent`.
    pub fn link(
        &self,
        inode: u64,
        new_parent: u64,
        new_name: &[u8],
        who: &Credentials,
    ) -> Result<Attr, FsError> {
        self.check_writable()?;
        valid_name(new_name)?;
        let dir_inode = self.live_inode(new_parent)?;
        let target = self.live_inode(inode)?;
        if inode == new_parent {
            return Err(FsError::NotPermitted);
        }
        let mut dir_data = dir_inode.lock_dir();
        self.check_dir_writable(new_parent, &dir_data, who)?;
        let mut data = target.data.lock();
        if data.is_dir() {
            return Err(FsError::NotPermitted);
        }
        crate::flags::check_link(&data)?;
        if data.core.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if data.core.nlink == 0 {
            // Only an O_TMPFILE file may get a link back (the kernel's I_LINKABLE).
            return match data.linkable {
                true => {
                    self.link_unnamed((inode, &mut data), (new_parent, &mut dir_data), new_name)
                }
                false => Err(FsError::NotFound),
            };
        }
        let mut tx = self.begin(Reservation::create(&self.geometry))?;
        if dir::lookup(self, &mut tx, &dir_data, new_name)?.is_some() {
            tx.tx.cancel()?;
            return Err(FsError::Exists);
        }
        let file_type = data.file_type().unwrap_or(FileType::Regular);
        if let Err(error) = dir::add(self, &mut tx, &mut dir_data, new_name, inode, file_type) {
            self.commit_failed(tx)?;
            return Err(error);
        }
        let now = now();
        data.core.nlink += 1;
        data.core.ctime = now;
        dir_data.core.mtime = now;
        dir_data.core.ctime = now;
        Self::log_inode(&mut tx, new_parent, &mut dir_data);
        Self::log_inode(&mut tx, inode, &mut data);
        self.commit(tx, &mut [&mut dir_data, &mut data])?;
        data.lookups += 1;
        Ok(data.attr(inode, self.geometry.block_size))
    }
}

/// Most links one inode may have.
pub(crate) const LINK_MAX: u32 = u32::MAX - 1;

fn dot(name: &[u8], inode: u64, cookie: u64) -> DirEntry {
    DirEntry {
        name: name.to_vec(),
        inode,
        kind: FileKind::Directory,
        cookie,
    }
}

/// AG of an inode number, as a helper on the geometry.
pub(crate) trait SplitAg {
    fn split_ag(&self, number: u64) -> u32;
}

impl SplitAg for cairn_format::Geometry {
    fn split_ag(&self, number: u64) -> u32 {
        ((number >> self.ag_inode_bits()) as u32).min(self.ag_count - 1)
    }
}

impl Filesystem {
    /// Directory `number` must be a directory the caller may write and search.
    pub(crate) fn check_dir_writable(
        &self,
        number: u64,
        data: &InodeData,
        who: &Credentials,
    ) -> Result<(), FsError> {
        if !data.is_dir() {
            return Err(FsError::NotDirectory);
        }
        // A removed directory (still open or looked up) takes no new entries: they would go
        // with it when it is freed, leaving inodes no directory names (Linux: ENOENT).
        if data.core.nlink == 0 {
            return Err(FsError::NotFound);
        }
        crate::flags::check_entry_change(data)?;
        self.permission(number, data, who, perm::WRITE | perm::EXECUTE)
    }
}
