//! POSIX ACL semantics, as Linux's `fs/posix_acl.c` gives them to XFS: which permission bits
//! an access ACL stands for, how chmod rewrites it, how a new inode inherits its parent's
//! default ACL, and the access check. The lists themselves are stored as the attributes
//! `system.posix_acl_access` and `system.posix_acl_default` (codec in `cairn_format::acl`).

use cairn_format::acl::{Acl, AclTag};

use crate::FsError;
use crate::types::Credentials;

const RWX: u16 = 0o7;

/// The permission bits (owner, group, other) an access ACL stands for: the group bits are
/// the MASK entry's when there is one. Also whether the list says nothing more than those
/// bits (no MASK and no named entries), in which case it is not stored at all.
pub(crate) fn mode_bits(acl: &Acl) -> (u16, bool) {
    let mut mode = 0u16;
    let mut equivalent = true;
    let mut mask = None;
    for entry in &acl.entries {
        let perm = u16::from(entry.perm) & RWX;
        match entry.tag {
            AclTag::UserObj => mode |= perm << 6,
            AclTag::GroupObj => mode |= perm << 3,
            AclTag::Other => mode |= perm,
            AclTag::Mask => {
                mask = Some(perm);
                equivalent = false;
            }
            AclTag::User(_) | AclTag::Group(_) => equivalent = false,
        }
    }
    if let Some(mask) = mask {
        mode = (mode & !(RWX << 3)) | mask << 3;
    }
    (mode, equivalent)
}

/// chmod of an inode with an access ACL: the owner, group (MASK, or GROUP_OBJ without one)
/// and other entries take the new permission bits.
pub(crate) fn chmod(acl: &mut Acl, mode: u16) {
    let has_mask = acl.entry(AclTag::Mask).is_some();
    for entry in &mut acl.entries {
        let shift = match entry.tag {
            AclTag::UserObj => 6,
            AclTag::Mask => 3,
            AclTag::GroupObj if !has_mask => 3,
            AclTag::Other => 0,
            _ => continue,
        };
        entry.perm = ((mode >> shift) & RWX) as u8;
    }
}

/// A new inode's access ACL from its parent's default ACL and the mode the creator asked
/// for (`posix_acl_create_masq`): each class's entry is cut to the requested bits and the
/// mode to the entry. Returns the mode's new permission bits, and the ACL unless it says
/// nothing more than them.
pub(crate) fn inherit(default: &Acl, mode: u16) -> (u16, Option<Acl>) {
    let mut acl = default.clone();
    let mut mode = mode;
    let mut equivalent = true;
    let has_mask = acl.entry(AclTag::Mask).is_some();
    for entry in &mut acl.entries {
        let shift = match entry.tag {
            AclTag::UserObj => 6,
            AclTag::Other => 0,
            AclTag::Mask => 3,
            AclTag::GroupObj if !has_mask => 3,
            AclTag::User(_) | AclTag::Group(_) | AclTag::GroupObj => {
                equivalent &= entry.tag == AclTag::GroupObj;
                continue;
            }
        };
        if entry.tag == AclTag::Mask {
            equivalent = false;
        }
        let perm = u16::from(entry.perm) & ((mode >> shift) & RWX);
        entry.perm = perm as u8;
        mode = (mode & !(RWX << shift)) | perm << shift;
    }
    (mode, (!equivalent).then_some(acl))
}

/// The ACL part of an access check by `who` (neither root nor the owner) for `want` (R=4,
/// W=2, X=1) on an inode of group `gid` (`posix_acl_permission`): the caller's named USER
/// entry, else every group entry that matches one of its groups (granted if one grants
/// it all), else OTHER; named and group entries are limited by the MASK.
pub(crate) fn permission(acl: &Acl, gid: u32, who: &Credentials, want: u32) -> Result<(), FsError> {
    let mask = acl
        .entry(AclTag::Mask)
        .map_or(u32::from(RWX), |m| u32::from(m.perm));
    let granted = |perm: u8, masked: bool| {
        let perm = u32::from(perm) & if masked { mask } else { 7 };
        perm & want == want
    };
    let decide = |ok: bool| match ok {
        true => Ok(()),
        false => Err(FsError::PermissionDenied),
    };
    if let Some(user) = acl.entry(AclTag::User(who.uid)) {
        return decide(granted(user.perm, true));
    }
    let mut matched = false;
    for entry in &acl.entries {
        let member = match entry.tag {
            AclTag::GroupObj => who.in_group(gid),
            AclTag::Group(id) => who.in_group(id),
            _ => false,
        };
        if member {
            matched = true;
            if granted(entry.perm, true) {
                return Ok(());
            }
        }
    }
    if matched {
        return Err(FsError::PermissionDenied);
    }
    let other = acl.entry(AclTag::Other).map_or(0, |e| e.perm);
    decide(granted(other, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::acl::AclEntry;

    fn acl(entries: &[(AclTag, u8)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm)| AclEntry { tag, perm })
                .collect(),
        }
    }

    fn who(uid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid: uid,
            groups: groups.to_vec(),
            umask: 0,
        }
    }

    // Mode bits: the mask stands for the group class; three entries are just a mode.
    #[test]
    fn acl_mode_bits_and_chmod() {
        let plain = Acl::from_mode(0o750);
        assert_eq!(mode_bits(&plain), (0o750, true));
        let mut named = acl(&[
            (AclTag::UserObj, 7),
            (AclTag::User(5), 6),
            (AclTag::GroupObj, 4),
            (AclTag::Mask, 6),
            (AclTag::Other, 0),
        ]);
        assert_eq!(mode_bits(&named), (0o760, false));
        chmod(&mut named, 0o541);
        assert_eq!(mode_bits(&named), (0o541, false));
        assert_eq!(
            named.entry(AclTag::GroupObj).unwrap().perm,
            4,
            "GROUP_OBJ kept"
        );
        assert_eq!(
            named.entry(AclTag::User(5)).unwrap().perm,
            6,
            "named entries kept"
        );
    }

    // Inheritance cuts the entries of each class to the requested mode, and the mode to them.
    #[test]
    fn acl_inheritance() {
        let default = acl(&[
            (AclTag::UserObj, 7),
            (AclTag::User(5), 7),
            (AclTag::GroupObj, 5),
            (AclTag::Mask, 7),
            (AclTag::Other, 5),
        ]);
        let (mode, access) = inherit(&default, 0o666);
        assert_eq!(mode, 0o664);
        let access = access.unwrap();
        assert_eq!(access.entry(AclTag::Mask).unwrap().perm, 6);
        assert_eq!(
            access.entry(AclTag::User(5)).unwrap().perm,
            7,
            "masked, not cut"
        );
        let (mode, access) = inherit(&Acl::from_mode(0o750), 0o666);
        assert_eq!((mode, access), (0o640, None));
    }

    // The check: named user, then groups, then other; the mask limits named and groups.
    #[test]
    fn acl_permission_order() {
        let list = acl(&[
            (AclTag::UserObj, 7),
            (AclTag::User(5), 7),
            (AclTag::GroupObj, 4),
            (AclTag::Group(20), 2),
            (AclTag::Mask, 6),
            (AclTag::Other, 1),
        ]);
        assert!(permission(&list, 10, &who(5, &[]), 6).is_ok());
        assert!(permission(&list, 10, &who(5, &[]), 1).is_err(), "masked");
        assert!(permission(&list, 10, &who(6, &[10, 20]), 4).is_ok());
        assert!(permission(&list, 10, &who(6, &[10, 20]), 2).is_ok());
        assert!(
            permission(&list, 10, &who(6, &[10, 20]), 6).is_err(),
            "no single entry"
        );
        assert!(
            permission(&list, 10, &who(6, &[20]), 1).is_err(),
            "matched, no other"
        );
        assert!(permission(&list, 10, &who(7, &[]), 1).is_ok());
        assert!(permission(&list, 10, &who(7, &[]), 4).is_err());
    }
}
