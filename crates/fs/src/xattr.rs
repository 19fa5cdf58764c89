//! Extended attributes: `setxattr`, `getxattr`, `listxattr` and `removexattr`, with the
//! namespace rules, and the POSIX ACLs kept in two of them (storage is in
//! `xattr_store.rs`, ACL semantics in `acl.rs`).
//!
//! Names carry their namespace as a prefix: "user.", "trusted." or "security.", and in
//! "system." only `system.posix_acl_access` and `system.posix_acl_default` (other system
//! names are `Unsupported`). The full name is at most 255 bytes and values at most 64 KiB
//! (`Range` otherwise). Rules, as Linux applies them:
//! - trusted: only root reads, writes or lists them (others get `NoData` on reads,
//!   `NotPermitted` on writes, and do not see them listed);
//! - security: anyone reads them, only root writes them; `security.capability` may also be
//!   removed by anyone who may write the file (Linux drops it on every write);
//! - user: only on regular files and directories (`NoData` / `NotPermitted` elsewhere),
//!   read and write permission on the inode as for its data, and in a sticky directory only
//!   its owner (or root) writes them;
//! - POSIX ACLs: anyone reads them; the owner or root sets and removes them. A value must be
//!   a valid ACL (`InvalidArgument`); an access ACL also sets the permission bits (the group
//!   bits become its mask), and one that says no more than those bits is not stored; a
//!   default ACL is for directories only (`PermissionDenied`).

use std::sync::Arc;

use cairn_btree::CacheContext;
use cairn_format::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME, Acl};
use cairn_format::inode::{MODE_PERMISSION_MASK, MODE_TYPE_MASK};
use cairn_format::limits::{XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};
use cairn_format::xattr::Namespace;

use crate::fs::Filesystem;
use crate::inode::{Acls, InodeData, now};
use crate::types::{Credentials, XattrFlags};
use crate::xattr_store::{self, Edit};
use crate::{FsError, acl, perm};

const PREFIXES: [(&[u8], Namespace); 4] = [
    (b"user.", Namespace::User),
    (b"trusted.", Namespace::Trusted),
    (b"security.", Namespace::Security),
    (b"system.", Namespace::System),
];

const STICKY: u16 = 0o1000;
const SETGID: u16 = 0o2000;

/// The stored name of `security.capability`.
const CAPABILITY: &[u8] = b"capability";

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
            let acl = rest == ACL_ACCESS_NAME || rest == ACL_DEFAULT_NAME;
            if namespace == Namespace::System && !acl {
                return Err(FsError::Unsupported);
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

/// What a caller does to an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    /// Removing `security.capability` on behalf of a writer of the file.
    DropCapability,
    /// A change the caller has checked already (chmod rewriting the access ACL).
    Checked,
}

impl Filesystem {
    /// Whether `who` may perform `access` on attributes of `namespace` on inode `number`.
    fn check_xattr_access(
        &self,
        number: u64,
        data: &InodeData,
        namespace: Namespace,
        who: &Credentials,
        access: Access,
    ) -> Result<(), FsError> {
        let write = access != Access::Read;
        if write && access != Access::Checked {
            crate::flags::check_xattr_change(data)?;
        }
        let refused = match write {
            true => FsError::NotPermitted,
            false => FsError::NoData,
        };
        match namespace {
            _ if access == Access::Checked => Ok(()),
            Namespace::Trusted if who.uid != 0 => Err(refused),
            Namespace::Trusted => Ok(()),
            Namespace::Security if access == Access::DropCapability && who.uid != 0 => {
                self.permission(number, data, who, perm::WRITE)
            }
            Namespace::Security if write && who.uid != 0 => Err(FsError::NotPermitted),
            Namespace::Security => Ok(()),
            Namespace::System if write && !perm::is_owner(data, who) => Err(FsError::NotPermitted),
            Namespace::System => Ok(()),
            Namespace::User => {
                let regular = data.file_type() == Some(cairn_format::inode::FileType::Regular);
                if !data.is_dir() && !regular {
                    return Err(refused);
                }
                let sticky = data.is_dir() && data.core.mode & STICKY != 0;
                if write && sticky && !perm::is_owner(data, who) {
                    return Err(FsError::NotPermitted);
                }
                let mask = if write { perm::WRITE } else { perm::READ };
                self.permission(number, data, who, mask)
            }
        }
    }

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
        if namespace == Namespace::System {
            return self.set_acl(inode, stored, value, flags, who);
        }
        let edit = Edit::Put {
            key: (namespace, stored),
            value,
            flags,
        };
        self.change_xattrs(inode, namespace, who, Access::Write, |_| Ok(edit))
    }

    /// Sets an ACL attribute (`stored` is its name in the System namespace).
    fn set_acl(
        &self,
        inode: u64,
        stored: &[u8],
        value: &[u8],
        flags: XattrFlags,
        who: &Credentials,
    ) -> Result<(), FsError> {
        let acl = Acl::decode(value).map_err(|_| FsError::InvalidArgument("not a valid ACL"))?;
        let access = stored == ACL_ACCESS_NAME;
        let key = (Namespace::System, stored);
        self.change_xattrs(inode, Namespace::System, who, Access::Write, |data| {
            let put = Edit::Put { key, value, flags };
            if !access {
                return match data.is_dir() {
                    true => Ok(put),
                    false => Err(FsError::PermissionDenied),
                };
            }
            let (bits, equivalent) = acl::mode_bits(&acl);
            // The set-ID and sticky bits stay; the rwx bits are the ACL's.
            let mut mode = (data.core.mode & MODE_PERMISSION_MASK & !0o777) | bits;
            if who.uid != 0 && !who.in_group(data.core.gid) {
                mode &= !SETGID;
            }
            data.core.mode = (data.core.mode & MODE_TYPE_MASK) | mode;
            Ok(match equivalent {
                true => Edit::Remove {
                    key,
                    flags,
                    required: false,
                },
                false => put,
            })
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
        let edit = Edit::Remove {
            key: (namespace, stored),
            flags: XattrFlags::Any,
            required: true,
        };
        self.change_xattrs(inode, namespace, who, access, |_| Ok(edit))
    }

    /// The value of attribute `name`.
    pub fn getxattr(&self, inode: u64, name: &[u8], who: &Credentials) -> Result<Vec<u8>, FsError> {
        let (namespace, stored) = parse_name(name)?;
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        self.check_xattr_access(inode, &data, namespace, who, Access::Read)?;
        self.xattr_value(inode, &data, namespace, stored)?
            .ok_or(FsError::NoData)
    }

    /// The full names of the attributes `who` may see (trusted ones only for root).
    pub fn listxattr(&self, inode: u64, who: &Credentials) -> Result<Vec<Vec<u8>>, FsError> {
        let handle = self.live_inode(inode)?;
        let data = handle.data.lock();
        let mut ctx = CacheContext::new(&self.cache);
        let entries = xattr_store::entries(self, &mut ctx, inode, &data)?;
        Ok(entries
            .iter()
            .filter(|e| e.namespace != Namespace::Trusted || who.uid == 0)
            .map(|e| full_name(e.namespace, &e.name))
            .collect())
    }

    /// The value of one attribute of inode `number` (held locked by the caller).
    pub(crate) fn xattr_value(
        &self,
        number: u64,
        data: &InodeData,
        namespace: Namespace,
        name: &[u8],
    ) -> Result<Option<Vec<u8>>, FsError> {
        let mut ctx = CacheContext::new(&self.cache);
        xattr_store::get(self, &mut ctx, number, data, (namespace, name))
    }

    /// The POSIX ACLs of inode `number` (held locked by the caller), read once and kept
    /// with the inode until its attributes change.
    pub(crate) fn acls(&self, number: u64, data: &InodeData) -> Result<Acls, FsError> {
        if let Some(acls) = data.acls.get() {
            return Ok(acls.clone());
        }
        let mut acls = Acls::default();
        if data.core.attr_format.is_some() {
            let decode = |name: &[u8]| -> Result<Option<Arc<Acl>>, FsError> {
                let Some(raw) = self.xattr_value(number, data, Namespace::System, name)? else {
                    return Ok(None);
                };
                let acl = Acl::decode(&raw)
                    .map_err(|e| FsError::corrupt("POSIX ACL", number, e.to_string()))?;
                Ok(Some(Arc::new(acl)))
            };
            acls.access = decode(ACL_ACCESS_NAME)?;
            if data.is_dir() {
                acls.default = decode(ACL_DEFAULT_NAME)?;
            }
        }
        let _ = data.acls.set(acls.clone());
        Ok(acls)
    }

    /// Checks that `who` may access inode `number` (held locked) with `mask` (R=4, W=2,
    /// X=1), through its access ACL where it has one.
    pub(crate) fn permission(
        &self,
        number: u64,
        data: &InodeData,
        who: &Credentials,
        mask: u32,
    ) -> Result<(), FsError> {
        let access = match perm::needs_acl(data, who) {
            true => self.acls(number, data)?.access,
            false => None,
        };
        perm::check(data, access.as_deref(), who, mask)
    }

    /// chmod of an inode with an access ACL: `change` applies the setattr to the inode and
    /// the ACL's owner, group and other entries follow the new mode, in one transaction.
    pub(crate) fn chmod_with_acl(
        &self,
        inode: u64,
        access: &Acl,
        change: impl FnOnce(&mut InodeData),
    ) -> Result<(), FsError> {
        let who = Credentials::root();
        let mut acl = access.clone();
        let mut raw = Vec::new();
        let raw = &mut raw;
        self.change_xattrs(inode, Namespace::System, &who, Access::Checked, |data| {
            change(data);
            acl::chmod(&mut acl, data.core.mode & 0o777);
            *raw = acl
                .encode()
                .map_err(|e| FsError::corrupt("POSIX ACL", inode, e.to_string()))?;
            Ok(Edit::Put {
                key: (Namespace::System, ACL_ACCESS_NAME),
                value: raw.as_slice(),
                flags: XattrFlags::Any,
            })
        })
    }

    /// Applies the edit `plan` gives (it may also change the inode's core: an ACL sets the
    /// mode) to the attributes of `inode` in one transaction (plus the frees of
    /// unreferenced blocks after it). A failed change leaves the inode as it was.
    fn change_xattrs<'e>(
        &self,
        inode: u64,
        namespace: Namespace,
        who: &Credentials,
        access: Access,
        plan: impl FnOnce(&mut InodeData) -> Result<Edit<'e>, FsError>,
    ) -> Result<(), FsError> {
        let handle = self.live_inode(inode)?;
        let mut data = handle.data.lock();
        self.check_xattr_access(inode, &data, namespace, who, access)?;
        let core_before = data.core;
        let edit = match plan(&mut data) {
            Ok(edit) => edit,
            Err(error) => {
                data.core = core_before;
                return Err(error);
            }
        };
        let reservation = xattr_store::change_reservation(self, inode, &data);
        let mut tx = match reservation.and_then(|r| self.begin(r)) {
            Ok(tx) => tx,
            Err(error) => {
                data.core = core_before;
                return Err(error);
            }
        };
        let stored = xattr_store::apply(self, &mut tx, inode, &mut data, &edit);
        match stored {
            Ok(_) => data.core.ctime = now(),
            Err(_) => data.core = core_before,
        }
        data.acls = Default::default();
        Self::log_inode(&mut tx, inode, &mut data);
        self.commit(tx, &mut [&mut data])?;
        if let Some(unused) = stored? {
            xattr_store::free_unused(self, unused)?;
        }
        Ok(())
    }
}
