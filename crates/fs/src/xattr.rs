//! Extended attributes: `setxattr`, `getxattr`, `listxattr` and `removexattr`, with the
//! namespace rules (storage is in `xattr_store.rs`).
//!
//! Names carry their namespace as a prefix: "user.", "trusted." or "security." (other
//! prefixes, "system." included, are `Unsupported`). The full name is at most 255 bytes and
//! values at most 64 KiB (`Range` otherwise). Rules, as Linux applies them:
//! - trusted: only root reads, writes or lists them (others get `NoData` on reads,
//!   `NotPermitted` on writes, and do not see them listed);
//! - security: anyone reads them, only root writes them;
//! - user: only on regular files and directories (`NoData` / `NotPermitted` elsewhere),
//!   read and write permission on the inode as for its data, and in a sticky directory only
//!   its owner (or root) writes them.

use cairn_btree::CacheContext;
use cairn_format::limits::{XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};
use cairn_format::xattr::{Namespace, XattrLeafEntry, XattrValue};

use crate::bmap::step_reservation;
use crate::fs::Filesystem;
use crate::inode::{InodeData, now};
use crate::types::{Credentials, XattrFlags};
use crate::xattr_store::{self, AttrSet};
use crate::{FsError, perm};

const PREFIXES: [(&[u8], Namespace); 3] = [
    (b"user.", Namespace::User),
    (b"trusted.", Namespace::Trusted),
    (b"security.", Namespace::Security),
];

const STICKY: u16 = 0o1000;

/// Splits a full attribute name into its namespace and stored name.
fn parse_name(name: &[u8]) -> Result<(Namespace, &[u8]), FsError> {
    if name.len() > XATTR_NAME_LEN_MAX {
        return Err(FsError::Range);
    }
    for (prefix, namespace) in PREFIXES {
        if let Some(rest) = name.strip_prefix(prefix) {
            if rest.is_empty() {
                return Err(FsError::InvalidArgument("attribute name without a suffix"));
            }
            return Ok((namespace, rest));
        }
    }
    Err(FsError::Unsupported)
}

/// The full name of a stored attribute.
fn full_name(namespace: Namespace, name: &[u8]) -> Vec<u8> {
    let prefix = PREFIXES
        .iter()
        .find(|(_, ns)| *ns == namespace)
        .map_or(&b"system."[..], |(prefix, _)| prefix);
    [prefix, name].concat()
}

/// The stored name of `security.capability`.
const CAPABILITY: &[u8] = b"capability";

/// What a caller does to an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    /// Removing `security.capability` on behalf of a writer of the file.
    DropCapability,
}

/// Whether `who` may perform `access` on attributes of `namespace` on `data`.
fn check_access(
    data: &InodeData,
    namespace: Namespace,
    who: &Credentials,
    access: Access,
) -> Result<(), FsError> {
    let write = access != Access::Read;
    let refused = match write {
        true => FsError::NotPermitted,
        false => FsError::NoData,
    };
    match namespace {
        Namespace::Trusted if who.uid != 0 => Err(refused),
        Namespace::Trusted => Ok(()),
        Namespace::Security if access == Access::DropCapability && who.uid != 0 => {
            perm::check(data, who, perm::WRITE)
        }
        Namespace::Security if write && who.uid != 0 => Err(FsError::NotPermitted),
        Namespace::Security => Ok(()),
        Namespace::System => Err(FsError::Unsupported),
        Namespace::User => {
            if !data.is_dir() && data.file_type() != Some(cairn_format::inode::FileType::Regular) {
                return Err(refused);
            }
            let sticky = data.is_dir() && data.core.mode & STICKY != 0;
            if write && sticky && !perm::is_owner(data, who) {
                return Err(FsError::NotPermitted);
            }
            let mask = if write { perm::WRITE } else { perm::READ };
            perm::check(data, who, mask)
        }
    }
}

impl Filesystem {
    /// Sets attribute `name` to `value`; `flags` may require it to be new or to exist.
    pub fn setxattr(
        &self,
        inode: u64,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
        who: &Credentials,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        let (namespace, stored) = parse_name(name)?;
        if value.len() > XATTR_VALUE_LEN_MAX {
            return Err(FsError::Range);
        }
        let entry = XattrLeafEntry {
            namespace,
            name: stored.to_vec(),
            value: XattrValue::Local(value.to_vec()),
        };
        self.change_xattrs(inode, namespace, who, Access::Write, |set, block_size| {
            match (set.find(namespace, stored), flags) {
                (Some(_), XattrFlags::Create) => return Err(FsError::Exists),
                (None, XattrFlags::Replace) => return Err(FsError::NoData),
                (Some(index), _) => set.remove(index, block_size),
                (None, _) => {}
            }
            set.entries.push(entry);
            Ok(())
        })
    }

    /// Removes attribute `name` (`NoData` when it does not exist). `security.capability`
    /// may also go at the request of anyone who may write the file: Linux drops it on every
    /// write, truncate and chown, asking on the writer's behalf.
    pub fn removexattr(&self, inode: u64, name: &[u8], who: &Credentials) -> Result<(), FsError> {
        self.check_writable()?;
        let (namespace, stored) = parse_name(name)?;
        let killpriv = namespace == Namespace::Security && stored == CAPABILITY;
        let access = match killpriv {
            true => Access::DropCapability,
            false => Access::Write,
        };
        self.change_xattrs(inode, namespace, who, access, |set, block_size| {
            let index = set.find(namespace, stored).ok_or(FsError::NoData)?;
            set.remove(index, block_size);
            Ok(())
        })
    }

    /// The value of attribute `name`.
    pub fn getxattr(&self, inode: u64, name: &[u8], who: &Credentials) -> Result<Vec<u8>, FsError> {
        let (namespace, stored) = parse_name(name)?;
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        check_access(&data, namespace, who, Access::Read)?;
        let set = self.read_xattrs(inode, &data)?;
        let index = set.find(namespace, stored).ok_or(FsError::NoData)?;
        match &set.entries[index].value {
            XattrValue::Local(value) => Ok(value.clone()),
            XattrValue::Remote { block, length } => xattr_store::read_remote(self, *block, *length),
        }
    }

    /// The full names of the attributes `who` may see (trusted ones only for root).
    pub fn listxattr(&self, inode: u64, who: &Credentials) -> Result<Vec<Vec<u8>>, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        let set = self.read_xattrs(inode, &data)?;
        Ok(set
            .entries
            .iter()
            .filter(|e| e.namespace != Namespace::Trusted || who.uid == 0)
            .map(|e| full_name(e.namespace, &e.name))
            .collect())
    }

    fn read_xattrs(&self, inode: u64, data: &InodeData) -> Result<AttrSet, FsError> {
        let mut ctx = CacheContext::new(&self.cache);
        xattr_store::load(self, &mut ctx, inode, data)
    }

    /// Loads the attributes of `inode`, applies `change`, and stores them in one transaction
    /// (plus the free of unreferenced blocks after it).
    fn change_xattrs(
        &self,
        inode: u64,
        namespace: Namespace,
        who: &Credentials,
        access: Access,
        change: impl FnOnce(&mut AttrSet, u32) -> Result<(), FsError>,
    ) -> Result<(), FsError> {
        let handle = self.live_inode(inode)?;
        let mut data = handle.data.lock();
        check_access(&data, namespace, who, access)?;
        let mut tx = self.begin(step_reservation(self))?;
        let planned = xattr_store::load(self, &mut tx, inode, &data).and_then(|mut set| {
            change(&mut set, self.geometry.block_size)?;
            let layout = xattr_store::plan(self, inode, &data, &set)?;
            Ok((set, layout))
        });
        let (set, layout) = match planned {
            Ok(planned) => planned,
            Err(error) => {
                tx.tx.cancel()?;
                return Err(error);
            }
        };
        let stored = xattr_store::store(self, &mut tx, inode, &mut data, set, layout);
        if stored.is_ok() {
            data.core.ctime = now();
        }
        Self::log_inode(&mut tx, inode, &mut data);
        Self::commit(tx, &mut [&mut data])?;
        if let Some(unused) = stored? {
            xattr_store::free_unused(self, unused)?;
        }
        Ok(())
    }
}
