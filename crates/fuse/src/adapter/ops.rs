//! The `fuser::Filesystem` trait: one short method per request type.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use cairn_fs::{Credentials, FileKind, FsError, OpenFile, WriteOrigin};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, FopenFlags, INodeNo, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::CairnFs;
use super::file::{copy_range, fallocate_mode, fopen_flags, open_mode, seek_kind};
use super::node::{rename_mode, set_attr};
use super::xattr::{is_reserved, name_list, reply_value, xattr_flags};
use crate::convert::{
    credentials, credentials_with_umask, kind_of_mode, name_bytes, permission_bits,
};
use crate::fileattr::{STATX_ATTRIBUTES_MASK, statx_attributes};
use crate::stats::Op;

fn errno(code: i32) -> Errno {
    Errno::from_i32(code)
}

impl fuser::Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.negotiate(config);
        Ok(())
    }

    /// A fuseblk unmount: the kernel's `umount` waits for this request's reply, so the
    /// filesystem is written back, its log left clean and its device closed first.
    fn destroy_requested(&self) {
        tracing::info!("FUSE_DESTROY: unmounting the filesystem before umount returns");
        self.core.unmount();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timer = self.requests.start(Op::Lookup, parent.0);
        match self
            .fs()
            .and_then(|fs| fs.lookup(self.inode(parent), name_bytes(name)))
        {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(FsError::NotFound) => self.reply_negative(reply),
            Err(error) => reply.error(self.fail(Op::Lookup, &error)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _timer = self.requests.start(Op::Forget, ino.0);
        self.drop_reference(self.inode(ino), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timer = self.requests.start(Op::Getattr, ino.0);
        match self.fs().and_then(|fs| fs.getattr(self.inode(ino))) {
            Ok(attr) => reply.attr(&self.settings.attr_timeout, &self.fuse_attr(&attr)),
            Err(error) => reply.error(self.fail(Op::Getattr, &error)),
        }
    }

    /// A stat that asked for more than the basic fields (the birth time): the kernel sends
    /// this instead of a getattr, never beside one, and caches the birth time.
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        let _timer = self.requests.start(Op::Statx, ino.0);
        match self.fs().and_then(|fs| fs.getattr(self.inode(ino))) {
            Ok(attr) => reply.statx(
                &self.settings.attr_timeout,
                &self.fuse_attr(&attr),
                statx_attributes(&attr.flags),
                STATX_ATTRIBUTES_MASK,
            ),
            Err(error) => reply.error(self.fail(Op::Statx, &error)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timer = self.requests.start(Op::Setattr, ino.0);
        let changes = set_attr(mode, uid, gid, size, (atime, mtime), ctime, fh);
        match self
            .fs()
            .and_then(|fs| fs.setattr(self.inode(ino), &changes, &credentials(req)))
        {
            Ok(attr) => reply.attr(&self.settings.attr_timeout, &self.fuse_attr(&attr)),
            Err(error) => reply.error(self.fail(Op::Setattr, &error)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timer = self.requests.start(Op::Readlink, ino.0);
        match self.fs().and_then(|fs| fs.readlink(self.inode(ino))) {
            Ok(target) => reply.data(&target),
            Err(error) => reply.error(self.fail(Op::Readlink, &error)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timer = self.requests.start(Op::Mknod, parent.0);
        let Some(kind) = kind_of_mode(mode) else {
            reply.error(self.refuse(Op::Mknod, errno(libc::EINVAL)));
            return;
        };
        let parent = self.inode(parent);
        let who = credentials_with_umask(req, umask);
        let (name, bits) = (name_bytes(name), permission_bits(mode));
        match self
            .fs()
            .and_then(|fs| fs.create(parent, name, kind, bits, rdev, &who))
        {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(error) => reply.error(self.fail(Op::Mknod, &error)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _timer = self.requests.start(Op::Mkdir, parent.0);
        let who = credentials_with_umask(req, umask);
        let parent = self.inode(parent);
        match self
            .fs()
            .and_then(|fs| fs.mkdir(parent, name_bytes(name), permission_bits(mode), &who))
        {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(error) => reply.error(self.fail(Op::Mkdir, &error)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.requests.start(Op::Unlink, parent.0);
        match self
            .fs()
            .and_then(|fs| fs.unlink(self.inode(parent), name_bytes(name), &credentials(req)))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Unlink, &error)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.requests.start(Op::Rmdir, parent.0);
        match self
            .fs()
            .and_then(|fs| fs.rmdir(self.inode(parent), name_bytes(name), &credentials(req)))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Rmdir, &error)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timer = self.requests.start(Op::Symlink, parent.0);
        let target = target.as_os_str().as_encoded_bytes();
        let (parent, who) = (self.inode(parent), credentials(req));
        match self
            .fs()
            .and_then(|fs| fs.symlink(parent, name_bytes(link_name), target, &who))
        {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(error) => reply.error(self.fail(Op::Symlink, &error)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Rename, parent.0);
        let Some((mode, whiteout)) = rename_mode(flags) else {
            reply.error(self.refuse(Op::Rename, errno(libc::EINVAL)));
            return;
        };
        let (from, to) = (self.inode(parent), self.inode(newparent));
        let (name, newname) = (name_bytes(name), name_bytes(newname));
        let who = credentials(req);
        let renamed = self.fs().and_then(|fs| match whiteout {
            true => fs.rename_whiteout(from, name, to, newname, mode, &who),
            false => fs.rename(from, name, to, newname, mode, &who),
        });
        match renamed {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Rename, &error)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = self.requests.start(Op::Link, ino.0);
        let (inode, parent) = (self.inode(ino), self.inode(newparent));
        match self
            .fs()
            .and_then(|fs| fs.link(inode, parent, name_bytes(newname), &credentials(req)))
        {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(error) => reply.error(self.fail(Op::Link, &error)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timer = self.requests.start(Op::Open, ino.0);
        let mode = open_mode(flags.0);
        let who = credentials(req);
        match self
            .fs()
            .and_then(|fs| fs.open_with(self.inode(ino), &mode, &who))
        {
            // The handle says whether its writes bypass the cache (O_DIRECT, or a file with
            // the sync flag).
            Ok(file) => reply.opened(FileHandle(file.handle), fopen_flags(file.handle)),
            Err(error) => reply.error(self.fail(Op::Open, &error)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let timer = self.requests.start(Op::Read, ino.0);
        let fs = match self.fs() {
            Ok(fs) => fs,
            Err(error) => return reply.error(self.fail(Op::Read, &error)),
        };
        if !self.hand_over_reads {
            return self.read_in_handler(&fs, (ino, fh), (offset, size), reply);
        }
        let started = timer.hand_over();
        let requests = std::sync::Arc::clone(&self.requests);
        let deliver = Box::new(move |data: Result<cairn_fs::ReadData, cairn_fs::FsError>| {
            match data {
                Ok(data) => reply.data(&data),
                Err(error) => reply.error(super::failed(&requests, Op::Read, &error)),
            }
            requests.record_since(Op::Read, started);
        });
        let queued = fuser::more_requests_waiting;
        if !fs.read_handed_over(self.inode(ino), fh.0, (offset, size), queued, deliver) {
            // The answer comes from the device's completion thread: the client's next
            // request follows it, not this thread's return.
            fuser::skip_next_spin();
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timer = self.requests.start(Op::Write, ino.0);
        // FUSE_HANDLE_KILLPRIV_V2: the kernel marks writes by a process without
        // CAP_FSETID, and leaves clearing the set-ID bits to us.
        let inode = self.inode(ino);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let writer = kill.then(|| credentials(req));
        // The inode flags' rules depend on whether this is the writeback of the kernel's
        // cache (FUSE_WRITE_CACHE, whose handle is a guess) and which handle it came by.
        let origin = WriteOrigin {
            handle: Some(fh.0),
            from_cache: write_flags.contains(WriteFlags::FUSE_WRITE_CACHE),
            clears_set_id: writer.as_ref(),
        };
        let written = self
            .fs()
            .and_then(|fs| fs.write_from(inode, offset, data, &origin));
        match written {
            Ok(written) => reply.written(written),
            Err(error) => reply.error(self.fail(Op::Write, &error)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes reach the filesystem before their replies (the kernel writes its dirty
        // pages back before it sends a flush), so there is nothing to do. ENOSYS tells the
        // kernel so once: it stops sending flushes (`fc->no_flush`), which saves every
        // close(2) a round trip, and still writes dirty pages back at close.
        let _timer = self.requests.start(Op::Flush, ino.0);
        reply.error(errno(libc::ENOSYS));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Release, ino.0);
        let file = OpenFile {
            inode: self.inode(ino),
            handle: fh.0,
        };
        match self.fs().and_then(|fs| fs.release(file)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Release, &error)),
        }
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, data: bool, reply: ReplyEmpty) {
        let _timer = self.requests.start(Op::Fsync, ino.0);
        match self.fs().and_then(|fs| fs.fsync(self.inode(ino), data)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Fsync, &error)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _timer = self.requests.start(Op::Opendir, ino.0);
        match self.fs().and_then(|fs| fs.getattr(self.inode(ino))) {
            Ok(attr) if attr.kind == FileKind::Directory => {
                // Listings are stateless (cookies), and the kernel may cache them: it drops
                // the cache itself when an entry changes through this mount.
                let flags = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
                reply.opened(FileHandle(0), flags);
            }
            Ok(_) => reply.error(self.refuse(Op::Opendir, errno(libc::ENOTDIR))),
            Err(error) => reply.error(self.fail(Op::Opendir, &error)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timer = self.requests.start(Op::Readdir, ino.0);
        match self.fill_readdir(self.inode(ino), offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Readdir, &error)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _timer = self.requests.start(Op::Readdirplus, ino.0);
        match self.fill_readdirplus(self.inode(ino), offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Readdirplus, &error)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Releasedir, ino.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Fsyncdir, ino.0);
        match self.fs().and_then(|fs| fs.fsync(self.inode(ino), datasync)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Fsyncdir, &error)),
        }
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _timer = self.requests.start(Op::Statfs, ino.0);
        match self.fs().and_then(|fs| fs.statfs()) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.inodes,
                s.inodes_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(error) => reply.error(self.fail(Op::Statfs, &error)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Setxattr, ino.0);
        if is_reserved(name) {
            return reply.error(self.refuse(Op::Setxattr, errno(libc::EPERM)));
        }
        let Some(flags) = xattr_flags(flags) else {
            return reply.error(self.refuse(Op::Setxattr, errno(libc::EINVAL)));
        };
        let (inode, who) = (self.inode(ino), credentials(req));
        match self
            .fs()
            .and_then(|fs| fs.setxattr(inode, name_bytes(name), value, flags, &who))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Setxattr, &error)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timer = self.requests.start(Op::Getxattr, ino.0);
        let inode = self.inode(ino);
        match self.reserved_value(req.uid(), inode, name, size) {
            Some(Ok(value)) => return reply_value(reply, size, &value),
            Some(Err(errno)) => return reply.error(self.refuse(Op::Getxattr, errno)),
            None => {}
        }
        if is_reserved(name) {
            return reply.error(self.refuse(Op::Getxattr, errno(libc::ENODATA)));
        }
        match self
            .fs()
            .and_then(|fs| fs.getxattr(inode, name_bytes(name), &credentials(req)))
        {
            Ok(value) => reply_value(reply, size, &value),
            // Absent attributes are the common case (security.capability on every write).
            Err(FsError::NoData) => reply.error(errno(libc::ENODATA)),
            Err(error) => reply.error(self.fail(Op::Getxattr, &error)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timer = self.requests.start(Op::Listxattr, ino.0);
        match self
            .fs()
            .and_then(|fs| fs.listxattr(self.inode(ino), &credentials(req)))
        {
            Ok(names) => reply_value(reply, size, &name_list(&names)),
            Err(error) => reply.error(self.fail(Op::Listxattr, &error)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.requests.start(Op::Removexattr, ino.0);
        if is_reserved(name) {
            return reply.error(self.refuse(Op::Removexattr, errno(libc::EPERM)));
        }
        match self
            .fs()
            .and_then(|fs| fs.removexattr(self.inode(ino), name_bytes(name), &credentials(req)))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Removexattr, &error)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _timer = self.requests.start(Op::Access, ino.0);
        let mask = (mask.bits() & 7) as u32;
        match self
            .fs()
            .and_then(|fs| fs.access(self.inode(ino), mask, &credentials(req)))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Access, &error)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timer = self.requests.start(Op::Create, parent.0);
        let Some(kind) = kind_of_mode(mode) else {
            reply.error(self.refuse(Op::Create, errno(libc::EINVAL)));
            return;
        };
        let (parent, who) = (self.inode(parent), credentials_with_umask(req, umask));
        let attr = match self.fs().and_then(|fs| {
            fs.create(
                parent,
                name_bytes(name),
                kind,
                permission_bits(mode),
                0,
                &who,
            )
        }) {
            Ok(attr) => attr,
            Err(error) => return reply.error(self.fail(Op::Create, &error)),
        };
        self.open_created(Op::Create, &attr, flags, reply);
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timer = self.requests.start(Op::Tmpfile, parent.0);
        let (parent, who) = (self.inode(parent), credentials_with_umask(req, umask));
        // O_EXCL: the file may never get a name (the kernel refuses the link as well).
        let exclusive = flags & libc::O_EXCL != 0;
        let made = self
            .fs()
            .and_then(|fs| fs.tmpfile(parent, permission_bits(mode), exclusive, &who));
        match made {
            Ok(attr) => self.open_created(Op::Tmpfile, &attr, flags, reply),
            Err(error) => reply.error(self.fail(Op::Tmpfile, &error)),
        }
    }

    /// The inode flag ioctls (chattr, lsattr, FS_IOC_FSSETXATTR), which the kernel sends
    /// restricted (their data copied in and out for us); others are ENOTTY.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _timer = self.requests.start(Op::Ioctl, ino.0);
        match self.serve_ioctl(req, self.inode(ino), cmd, in_data) {
            Ok(Ok(out)) if out.len() <= out_size as usize => reply.ioctl(0, &out),
            Ok(Ok(_)) => reply.error(self.refuse(Op::Ioctl, errno(libc::EINVAL))),
            Ok(Err(errno)) => reply.error(self.refuse(Op::Ioctl, errno)),
            Err(error) => reply.error(self.fail(Op::Ioctl, &error)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _timer = self.requests.start(Op::Fallocate, ino.0);
        let Some(mode) = fallocate_mode(mode) else {
            reply.error(self.refuse(Op::Fallocate, errno(libc::EOPNOTSUPP)));
            return;
        };
        let who = credentials(req);
        match self
            .fs()
            .and_then(|fs| fs.fallocate_by(self.inode(ino), offset, length, mode, &who))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.fail(Op::Fallocate, &error)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _timer = self.requests.start(Op::Lseek, ino.0);
        let (Some(kind), Ok(offset)) = (seek_kind(whence), u64::try_from(offset)) else {
            reply.error(self.refuse(Op::Lseek, errno(libc::EINVAL)));
            return;
        };
        let found = self
            .fs()
            .and_then(|fs| fs.seek(self.inode(ino), offset, kind));
        match found.map(i64::try_from) {
            Ok(Ok(found)) => reply.offset(found),
            Ok(Err(_)) => reply.error(self.refuse(Op::Lseek, errno(libc::EOVERFLOW))),
            Err(error) => reply.error(self.fail(Op::Lseek, &error)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _timer = self.requests.start(Op::CopyFileRange, ino_in.0);
        let source = (self.inode(ino_in), offset_in);
        let target = (self.inode(ino_out), offset_out);
        match self
            .fs()
            .and_then(|fs| copy_range(&fs, source, target, len))
        {
            Ok(copied) => reply.written(copied),
            Err(error) => reply.error(self.fail(Op::CopyFileRange, &error)),
        }
    }
}

impl CairnFs {
    /// Opens the file a create or tmpfile request just made and answers with its entry and
    /// handle; if the open fails, the new inode's lookup reference goes again. The creator
    /// may open what it made whatever the new mode says (open(2) with O_CREAT or O_TMPFILE
    /// checks no permission on the new file), hence root credentials here.
    fn open_created(&self, op: Op, attr: &cairn_fs::Attr, flags: i32, reply: ReplyCreate) {
        let open = cairn_fs::OpenMode {
            truncate: false,
            ..open_mode(flags)
        };
        let opened = self
            .fs()
            .and_then(|fs| fs.open_with(attr.inode, &open, &Credentials::root()));
        match opened {
            Ok(file) => {
                let generation = fuser::Generation(u64::from(attr.generation));
                let fuse_attr = self.fuse_attr(attr);
                let ttl = self.settings.entry_timeout.min(self.settings.attr_timeout);
                let flags = fopen_flags(file.handle);
                reply.created(&ttl, &fuse_attr, generation, FileHandle(file.handle), flags);
            }
            Err(error) => {
                self.drop_reference(attr.inode, 1);
                reply.error(self.fail(op, &error));
            }
        }
    }

    /// A read answered before its handler returns (a ring entry takes its reply only then),
    /// still through the handle, so sequential `O_DIRECT` readers get read-ahead here too.
    fn read_in_handler(
        &self,
        fs: &cairn_fs::Filesystem,
        (ino, fh): (INodeNo, FileHandle),
        (offset, size): (u64, u32),
        reply: ReplyData,
    ) {
        let (landed, arrival) = std::sync::mpsc::sync_channel(1);
        let deliver = Box::new(move |data| {
            // The receiver waits below; a send cannot fail while it does.
            let _ = landed.send(data);
        });
        fs.read_handed_over(self.inode(ino), fh.0, (offset, size), || false, deliver);
        match arrival.recv() {
            Ok(Ok(data)) => reply.data(&data),
            Ok(Err(error)) => reply.error(self.fail(Op::Read, &error)),
            Err(_) => reply.error(Errno::EIO),
        }
    }
}
