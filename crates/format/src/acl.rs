//! POSIX access control lists, stored as the values of the `system.posix_acl_access` and
//! `system.posix_acl_default` attributes (namespace System, names `posix_acl_access` and
//! `posix_acl_default`) in Linux's own xattr format, the bytes the kernel hands over and
//! takes back unchanged (4 + 8 bytes an entry):
//!
//! | offset | size | field   | meaning                                                  |
//! |--------|------|---------|----------------------------------------------------------|
//! | 0      | 4    | version | 2                                                        |
//! | 4 + 8i | 2    | tag     | 1 USER_OBJ, 2 USER, 4 GROUP_OBJ, 8 GROUP, 16 MASK, 32 OTHER |
//! | 6 + 8i | 2    | perm    | bit 2 read, bit 1 write, bit 0 execute                   |
//! | 8 + 8i | 4    | id      | uid (USER), gid (GROUP), 0xffffffff for the others        |
//!
//! A valid list (Linux's `posix_acl_valid`, plus sorted ids): at least one entry; entries in
//! tag order USER_OBJ, USER..., GROUP_OBJ, GROUP..., MASK, OTHER; exactly one USER_OBJ,
//! GROUP_OBJ and OTHER; at most one MASK, which is required once there is a USER or GROUP
//! entry; USER and GROUP ids strictly increasing; perm at most 7.

use crate::FormatError;
use crate::limits::ACL_ENTRIES_MAX;
use crate::ondisk::{bad_field, get_u16, get_u32, need, put_u16, put_u32};
use crate::types::NULL_BLOCK;

const STRUCTURE: &str = "POSIX ACL";
/// The version word of the xattr format.
pub const ACL_VERSION: u32 = 2;
/// The id of entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// Stored name of the access ACL (namespace System).
pub const ACL_ACCESS_NAME: &[u8] = b"posix_acl_access";
/// Stored name of the default ACL (namespace System), directories only.
pub const ACL_DEFAULT_NAME: &[u8] = b"posix_acl_default";

/// What an entry grants permissions to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclTag {
    UserObj,
    User(u32),
    GroupObj,
    Group(u32),
    Mask,
    Other,
}

impl AclTag {
    fn code(self) -> u16 {
        match self {
            Self::UserObj => 1,
            Self::User(_) => 2,
            Self::GroupObj => 4,
            Self::Group(_) => 8,
            Self::Mask => 0x10,
            Self::Other => 0x20,
        }
    }

    fn id(self) -> u32 {
        match self {
            Self::User(id) | Self::Group(id) => id,
            _ => UNDEFINED_ID,
        }
    }

    fn from_code(code: u16, id: u32) -> Option<Self> {
        Some(match code {
            1 => Self::UserObj,
            2 => Self::User(id),
            4 => Self::GroupObj,
            8 => Self::Group(id),
            0x10 => Self::Mask,
            0x20 => Self::Other,
            _ => return None,
        })
    }

    /// Position in the required order (USER entries share one rank, GROUP entries another).
    fn rank(self) -> u8 {
        match self {
            Self::UserObj => 0,
            Self::User(_) => 1,
            Self::GroupObj => 2,
            Self::Group(_) => 3,
            Self::Mask => 4,
            Self::Other => 5,
        }
    }
}

/// One entry: a tag and its permission bits (read 4, write 2, execute 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: AclTag,
    pub perm: u8,
}

/// A POSIX ACL, its entries in the required order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// The three entries equivalent to permission bits `mode` (owner, group, other).
    pub fn from_mode(mode: u16) -> Acl {
        let perm = |shift: u16| ((mode >> shift) & 7) as u8;
        Acl {
            entries: vec![
                AclEntry {
                    tag: AclTag::UserObj,
                    perm: perm(6),
                },
                AclEntry {
                    tag: AclTag::GroupObj,
                    perm: perm(3),
                },
                AclEntry {
                    tag: AclTag::Other,
                    perm: perm(0),
                },
            ],
        }
    }

    /// Decodes and validates the xattr format.
    pub fn decode(raw: &[u8]) -> Result<Acl, FormatError> {
        need(STRUCTURE, raw, HEADER_BYTES)?;
        let bad = |field, value: u64, why| bad_field(STRUCTURE, NULL_BLOCK, field, value, why);
        let version = get_u32(raw, 0);
        if version != ACL_VERSION {
            return Err(bad("version", version.into(), "not 2"));
        }
        let body = raw.len() - HEADER_BYTES;
        if !body.is_multiple_of(ENTRY_BYTES) {
            return Err(bad(
                "length",
                raw.len() as u64,
                "not a whole number of entries",
            ));
        }
        let mut entries = Vec::with_capacity(body / ENTRY_BYTES);
        for at in (HEADER_BYTES..raw.len()).step_by(ENTRY_BYTES) {
            let code = get_u16(raw, at);
            let tag = AclTag::from_code(code, get_u32(raw, at + 4))
                .ok_or_else(|| bad("tag", code.into(), "unknown tag"))?;
            let perm = get_u16(raw, at + 2);
            if perm > 7 {
                return Err(bad("perm", perm.into(), "more than rwx"));
            }
            entries.push(AclEntry {
                tag,
                perm: perm as u8,
            });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(acl)
    }

    /// The xattr format of a valid list.
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        self.validate()?;
        let mut out = vec![0u8; HEADER_BYTES + ENTRY_BYTES * self.entries.len()];
        put_u32(&mut out, 0, ACL_VERSION);
        for (index, entry) in self.entries.iter().enumerate() {
            let at = HEADER_BYTES + ENTRY_BYTES * index;
            put_u16(&mut out, at, entry.tag.code());
            put_u16(&mut out, at + 2, u16::from(entry.perm));
            put_u32(&mut out, at + 4, entry.tag.id());
        }
        Ok(out)
    }

    /// Checks the rules in the module comment.
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |field, value: u64, why| bad_field(STRUCTURE, NULL_BLOCK, field, value, why);
        let count = self.entries.len();
        if count == 0 || count > ACL_ENTRIES_MAX {
            return Err(bad("count", count as u64, "outside 1..=ACL_ENTRIES_MAX"));
        }
        if let Some(entry) = self.entries.iter().find(|e| e.perm > 7) {
            return Err(bad("perm", entry.perm.into(), "more than rwx"));
        }
        let ordered = self.entries.windows(2).all(|pair| {
            let (a, b) = (pair[0].tag, pair[1].tag);
            match (a, b) {
                (AclTag::User(x), AclTag::User(y)) | (AclTag::Group(x), AclTag::Group(y)) => x < y,
                _ => a.rank() < b.rank(),
            }
        });
        if !ordered {
            return Err(bad("entries", count as u64, "out of order or repeated"));
        }
        let has = |rank: u8| self.entries.iter().any(|e| e.tag.rank() == rank);
        if !has(0) || !has(2) || !has(5) {
            return Err(bad(
                "entries",
                count as u64,
                "no USER_OBJ, GROUP_OBJ or OTHER",
            ));
        }
        if (has(1) || has(3)) && !has(4) {
            return Err(bad("entries", count as u64, "named entries without a MASK"));
        }
        Ok(())
    }

    /// The entry with `tag`, if any.
    pub fn entry(&self, tag: AclTag) -> Option<&AclEntry> {
        self.entries.iter().find(|e| e.tag == tag)
    }

    /// The entry with `tag`, for changing, if any.
    pub fn entry_mut(&mut self, tag: AclTag) -> Option<&mut AclEntry> {
        self.entries.iter_mut().find(|e| e.tag == tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(tag: AclTag, perm: u8) -> AclEntry {
        AclEntry { tag, perm }
    }

    // The minimal list round-trips and matches the mode; order, mask and ranges are checked.
    #[test]
    fn acl_rules() {
        let acl = Acl::from_mode(0o754);
        let raw = acl.encode().unwrap();
        assert_eq!(raw.len(), 4 + 3 * 8);
        assert_eq!(Acl::decode(&raw).unwrap(), acl);
        assert_eq!(acl.entry(AclTag::GroupObj).unwrap().perm, 5);
        let named = Acl {
            entries: vec![
                entry(AclTag::UserObj, 7),
                entry(AclTag::User(5), 6),
                entry(AclTag::User(9), 4),
                entry(AclTag::GroupObj, 5),
                entry(AclTag::Group(3), 1),
                entry(AclTag::Mask, 7),
                entry(AclTag::Other, 0),
            ],
        };
        assert_eq!(Acl::decode(&named.encode().unwrap()).unwrap(), named);
        let mut no_mask = named.clone();
        no_mask.entries.remove(5);
        assert!(no_mask.validate().is_err());
        let mut swapped = named.clone();
        swapped.entries.swap(1, 2);
        assert!(swapped.validate().is_err());
        let mut duplicate = named.clone();
        duplicate.entries[2].tag = AclTag::User(5);
        assert!(duplicate.validate().is_err());
        let mut no_other = named;
        no_other.entries.pop();
        assert!(no_other.validate().is_err());
        assert!(Acl { entries: vec![] }.validate().is_err());
        let mut raw = Acl::from_mode(0o700).encode().unwrap();
        raw[0] = 1;
        assert!(Acl::decode(&raw).is_err());
        assert!(Acl::decode(&raw[..5]).is_err());
    }

    fn any_acl() -> impl Strategy<Value = Acl> {
        let ids = || proptest::collection::btree_set(0u32..1000, 0..5);
        (0u8..8, ids(), 0u8..8, ids(), 0u8..8, 0u8..8).prop_map(|(u, users, g, groups, m, o)| {
            let named = !users.is_empty() || !groups.is_empty();
            let mut entries = vec![entry(AclTag::UserObj, u)];
            entries.extend(
                users
                    .iter()
                    .map(|&id| entry(AclTag::User(id), (id % 8) as u8)),
            );
            entries.push(entry(AclTag::GroupObj, g));
            entries.extend(
                groups
                    .iter()
                    .map(|&id| entry(AclTag::Group(id), (id % 8) as u8)),
            );
            if named || m % 2 == 1 {
                entries.push(entry(AclTag::Mask, m));
            }
            entries.push(entry(AclTag::Other, o));
            Acl { entries }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn acl_round_trip(acl in any_acl()) {
            let raw = acl.encode().unwrap();
            prop_assert_eq!(Acl::decode(&raw).unwrap(), acl);
        }

        #[test]
        fn acl_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Acl::decode(&raw);
        }
    }
}
